"""The router's signing secret and control credentials, as files in the state directory.

The signing secret is generated on first start and persisted (mode 0600) so a
restart keeps every issued identity valid; the control credentials
(:class:`RouterCredentials`) likewise, so id-tracker and kairosd keep theirs.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from kairos_common.credentials import (
    ADMIN_FILE,
    DAEMON_KEY_FILE,
    LIFECYCLE_FILE,
    daemon_file,
    discovery_root,
    read_credential,
    safe_instance_file_name,
)
from kairos_common.errors import ConfigError
from kairos_common.identity import new_secret


def digest(credential: bytes) -> str:
    """The hex SHA-256 a shared store keeps of a credential."""
    return hashlib.sha256(credential).hexdigest()


def load_or_create_secret(path: Path) -> bytes:
    """Hex secret from ``path``; created (0600) when missing."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            text = _create_private(path, new_secret().hex())
        except OSError as exc:
            raise ConfigError(f"cannot create signing secret {path}: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read signing secret {path}: {exc}") from exc
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = text.encode()
    if len(secret) < 16:
        raise ConfigError(f"signing secret {path} is shorter than 16 bytes")
    return secret


def _private_temp(path: Path, text: str) -> Path:
    """``text`` written whole, mode 0600, to a new file beside ``path`` (a name no
    other process or call uses), ready to be moved or linked into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(text + "\n")
    return tmp


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically with mode 0600 (never world-readable)."""
    os.replace(_private_temp(path, text), path)


def _create_private(path: Path, text: str) -> str:
    """Create ``path`` (0600) holding ``text``, unless another process got there first;
    the value that ``path`` holds afterwards either way.

    Two routers started together on one credentials folder (a pair on one host, a
    shared volume) must end with the same credential in memory and on disk: the
    file is written whole under a private name and hard-linked into place, which
    fails if ``path`` exists, so exactly one value wins and nobody reads a
    half-written file.
    """
    tmp = _private_temp(path, text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return read_credential(path)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        os.replace(tmp, path)  # a filesystem without hard links: last writer wins
    finally:
        tmp.unlink(missing_ok=True)
    return text


def _load_or_create_token(path: Path) -> str:
    if path.is_file():
        try:
            return read_credential(path)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (delete it to have a new one generated)") from None
    return _create_private(path, secrets.token_hex(32))


def derive_daemon_token(daemon_key: bytes, instance: str) -> bytes:
    """``HMAC-SHA256(daemon.key, instance)`` in hex: instance ``instance``'s daemon
    credential, the same on every router holding the same ``daemon.key``."""
    mac = hmac.new(daemon_key, b"kairos-daemon\0" + instance.encode(), hashlib.sha256)
    return mac.hexdigest().encode()


class RouterCredentials:
    """The router's admin, lifecycle and daemon credentials (docs/design.md §9).

    Daemon credentials are derived, ``HMAC-SHA256(daemon.key, instance)``, so an
    instance added at run time has one without any state, and one instance's
    credential says nothing about another's. Files live in ``folder`` (0700, files
    0600); :meth:`publish` makes them discoverable by port for local clients.
    """

    def __init__(self, folder: Path, admin_token: str | None = None) -> None:
        self.folder = folder
        try:
            existed = folder.is_dir()
            folder.mkdir(parents=True, exist_ok=True)
            try:
                os.chmod(folder, 0o700)
            except OSError:
                # A folder the operator provides read-only (a systemd credentials
                # directory, a Kubernetes Secret volume): its files are what counts.
                if not existed:
                    raise
            self.admin = (admin_token or _load_or_create_token(folder / ADMIN_FILE)).encode()
            self.lifecycle = _load_or_create_token(folder / LIFECYCLE_FILE).encode()
            self._daemon_key = _load_or_create_token(folder / DAEMON_KEY_FILE).encode()
        except OSError as exc:
            raise ConfigError(f"cannot create router credentials in {folder}: {exc}") from None
        self._published: Path | None = None

    def daemon_token(self, instance: str) -> bytes:
        """The daemon credential of ``instance`` (hex, as bytes)."""
        return derive_daemon_token(self._daemon_key, instance)

    def digests(self, instances: list[str]) -> dict[str, str]:
        """SHA-256 of each credential by role (``admin``, ``lifecycle``,
        ``daemon:<instance>``): what a shared store keeps so that another router
        accepts this router's credentials after a takeover, never the credentials."""
        out = {"admin": digest(self.admin), "lifecycle": digest(self.lifecycle)}
        for name in instances:
            out[f"daemon:{name}"] = digest(self.daemon_token(name))
        return out

    def write_daemon_file(self, instance: str) -> None:
        """Write ``daemon-<instance>.token`` (skipped for names unfit for a file)."""
        if not safe_instance_file_name(instance):
            return
        try:
            _write_private(
                self.folder / daemon_file(instance), self.daemon_token(instance).decode()
            )
        except OSError:
            return  # the derived credential still works; only the convenience file is missing

    def publish(self, port: int, env: Mapping[str, str] | None = None) -> None:
        """Point ``<discovery root>/<port>`` at the credentials folder (best effort)."""
        link = discovery_root(env) / str(port)
        try:
            link.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = link.with_name(f".{port}.{os.getpid()}.tmp")
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            tmp.symlink_to(self.folder.resolve(), target_is_directory=True)
            os.replace(tmp, link)
        except OSError:
            return
        self._published = link

    def unpublish(self) -> None:
        """Remove the discovery entry if it still points at this router's folder."""
        link = self._published
        self._published = None
        if link is None:
            return
        with contextlib.suppress(OSError):
            if link.is_symlink() and link.resolve() == self.folder.resolve():
                link.unlink()
