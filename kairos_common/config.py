"""Configuration: one TOML file per component, environment overrides, flags.

Precedence (lowest to highest): dataclass defaults < TOML file < environment
variables ``<PREFIX>_<FIELD>`` (``<PREFIX>_<SECTION>__<FIELD>`` for nested
sections) < explicit overrides (CLI flags). Each component declares its schema
as (nested) frozen dataclasses; :func:`load_config` validates types and rejects
unknown keys, so a typo in a config file is an error, not a silent default.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from kairos_common.errors import ConfigError

T = TypeVar("T")

CODE_ONLY: Mapping[str, Any] = types.MappingProxyType({"code_only": True})
"""Field metadata: a constant of the code, not operator configuration. Tests and
research set it in code; a file, the environment or a flag that sets it is an
error, and the generated reference leaves it out."""
NOTES = "docs/notes/configuration.md"
"""Where every constant that left the operator configuration is accounted for."""


def code_only(field: dataclasses.Field[Any]) -> bool:
    """Is ``field`` a constant of the code (:data:`CODE_ONLY`)?"""
    return bool(field.metadata.get("code_only"))


def _refusal(cls: type, key: str, dotted: str, retired: Mapping[str, str]) -> str | None:
    """Why ``key`` (``dotted`` in full) may not be set, or None when it may."""
    if dotted in retired:
        return f"{dotted} was removed: {retired[dotted]}"
    field = next((f for f in dataclasses.fields(cls) if f.name == key), None)
    if field is not None and code_only(field):
        return f"{dotted} is a constant of the code, not configuration ({NOTES})"
    return None


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert ``value`` (from TOML or an env string) to type ``tp``."""
    inner, optional = _unwrap_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("", "none")):
        if optional:
            return None
        raise ConfigError(f"{where}: a value is required")
    origin = typing.get_origin(inner)
    if dataclasses.is_dataclass(inner) and isinstance(inner, type):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table")
        return _build(inner, value, where)
    if origin in (list, tuple):
        (item_tp, *_) = typing.get_args(inner) or (str,)
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ConfigError(f"{where}: expected a list")
        seq = [
            _coerce(v.strip() if isinstance(v, str) else v, item_tp, where)
            for v in items
            if not (isinstance(v, str) and not v.strip())
        ]
        return tuple(seq) if origin is tuple else seq
    if inner is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if inner is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if inner is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if inner is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if inner is Path:
        return Path(str(value))
    raise ConfigError(f"{where}: unsupported config type {inner!r}")


def _unknown(names: list[str], known: list[str], what: str) -> ConfigError:
    """The error for misspelt keys, with the closest known name for each."""
    parts = []
    for name in names:
        close = difflib.get_close_matches(name, known, n=1)
        parts.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return ConfigError(f"{what}: unknown key(s) {', '.join(parts)}")


def _sub_schema(cls: type, name: str) -> type | None:
    tp, _ = _unwrap_optional(typing.get_type_hints(cls)[name])
    return tp if dataclasses.is_dataclass(tp) and isinstance(tp, type) else None


def _check_keys(
    cls: type,
    data: Mapping[str, Any],
    what: str,
    section: str = "",
    retired: Mapping[str, str] | None = None,
) -> None:
    """Reject keys ``cls`` does not have, removed keys (naming what replaced them)
    and constants of the code, naming their source (a file, the env)."""
    retired = retired or {}
    where = f"{what} [{section}]" if section else what
    for key in sorted(data):
        why = _refusal(cls, key, f"{section}.{key}" if section else key, retired)
        if why is not None:
            raise ConfigError(f"{where}: {why}")
    known = [f.name for f in dataclasses.fields(cls) if not code_only(f)]
    unknown = sorted(k for k in data if k not in known)
    if unknown:
        raise _unknown(unknown, known, where)
    for key, value in data.items():
        sub = _sub_schema(cls, key)
        if sub is not None and isinstance(value, Mapping):
            _check_keys(sub, value, what, f"{section}.{key}" if section else key, retired)


def _env_names(cls: type, prefix: str) -> list[str]:
    """Every environment variable the schema reads (``PREFIX_FIELD``, ``PREFIX_SEC__FIELD``)."""
    names = []
    for f in dataclasses.fields(cls):
        if code_only(f):
            continue
        sub = _sub_schema(cls, f.name)
        key = f"{prefix}_{f.name.upper()}"
        names.extend(_env_names(sub, f"{key}_") if sub is not None else [key])
    return names


def _check_env(
    cls: type, prefix: str, env: Mapping[str, str], retired: Mapping[str, str] | None = None
) -> None:
    known = _env_names(cls, prefix)
    unknown = sorted(k for k in env if k.startswith(f"{prefix}_") and k not in known)
    for name in unknown:
        why = _env_refusal(cls, name.removeprefix(f"{prefix}_"), retired or {})
        if why is not None:
            raise ConfigError(f"environment: {name}: {why}")
    if unknown:
        raise _unknown(unknown, known, "environment")


def _check_env_refusals(
    cls: type, prefix: str, env: Mapping[str, str], retired: Mapping[str, str]
) -> None:
    known = set(_env_names(cls, prefix))
    for name in sorted(k for k in env if k.startswith(f"{prefix}_") and k not in known):
        why = _env_refusal(cls, name.removeprefix(f"{prefix}_"), retired)
        if why is not None:
            raise ConfigError(f"environment: {name}: {why}")


def _env_refusal(cls: type, rest: str, retired: Mapping[str, str]) -> str | None:
    """Why the variable for ``rest`` (``SEC__FIELD``) names no key: a removed key or
    section, or a constant of the code; None if it is merely unknown."""
    parts = rest.lower().split("__")
    for n in range(1, len(parts) + 1):
        dotted = ".".join(parts[:n])
        if dotted in retired:
            return f"{dotted} was removed: {retired[dotted]}"
    schema: type = cls
    for n, part in enumerate(parts):
        why = _refusal(schema, part, ".".join(parts[: n + 1]), {})
        if why is not None:
            return why
        names = {f.name for f in dataclasses.fields(schema)}
        sub = _sub_schema(schema, part) if part in names else None
        if sub is None:
            return None
        schema = sub
    return None


def _build(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise _unknown(unknown, known, where or "config")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}" if where else str(exc)) from exc


def _env_layer(cls: type, prefix: str, env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if code_only(f):
            continue
        tp, _ = _unwrap_optional(hints[f.name])
        key = f"{prefix}_{f.name.upper()}"
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            sub = _env_layer(tp, f"{prefix}_{f.name.upper()}_", env)
            if sub:
                out[f.name] = sub
        elif key in env:
            out[f.name] = env[key]
    return out


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(merged.get(k), Mapping):
            merged[k] = _merge(dict(merged[k]), v)
        else:
            merged[k] = v
    return merged


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file with a clear error naming the file."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory, expected a TOML file") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not a TOML text file (binary content)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def load_config(
    cls: type[T],
    *,
    path: Path | None = None,
    env_prefix: str,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    strict_env: bool = False,
    retired: Mapping[str, str] | None = None,
) -> T:
    """Build ``cls`` from defaults, ``path``, the environment and ``overrides``.

    ``overrides`` with value ``None`` are ignored (an unset CLI flag). With
    ``strict_env`` a variable that starts with ``<env_prefix>_`` but names no
    key (``KAIROSD_POLCY``) is an error, like a misspelt key in the file; only
    for prefixes no other program shares (``KAIROS_ROUTER_URL`` is id-tracker's).
    ``retired`` maps removed dotted keys (or sections) to what replaced them: a
    file or variable that sets one is an error that says so. Fields marked
    :data:`CODE_ONLY` may not be set from outside the code either.
    """
    layers: dict[str, Any] = {}
    environ = os.environ if env is None else env
    if path is not None:
        data = read_toml(path)
        _check_keys(cls, data, f"config file {path}", retired=retired)
        layers = _merge(layers, data)
    if strict_env:
        _check_env(cls, env_prefix, environ, retired)
    else:  # a variable that sets a removed key or a constant of the code still says so
        _check_env_refusals(cls, env_prefix, environ, retired or {})
    layers = _merge(layers, _env_layer(cls, env_prefix, environ))
    if overrides:
        layers = _merge(layers, {k: v for k, v in overrides.items() if v is not None})
    return _build(cls, layers, "")


def config_reference(cls: type, section: str = "") -> list[tuple[str, str, str]]:
    """``(key, type, default)`` rows for docs generated from the real schema."""
    rows: list[tuple[str, str, str]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if code_only(f):
            continue
        tp, _ = _unwrap_optional(hints[f.name])
        key = f"{section}.{f.name}" if section else f.name
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            rows.extend(config_reference(tp, key))
            continue
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "(required)"
        rows.append((key, getattr(hints[f.name], "__name__", str(hints[f.name])), default))
    return rows
