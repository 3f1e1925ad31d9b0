"""Where the router's control credentials live, and how its clients find them.

The router has three credential roles (docs/design.md §9): *admin* (the operator),
*lifecycle* (id-tracker: start and end agents) and *daemon* (one per instance:
that instance's decisions only). A default install needs no flags, so the router
writes its credentials as files (mode 0600, directory 0700) into
``<state dir>/credentials`` and publishes that directory under a per-user
discovery path keyed by its port::

    $XDG_RUNTIME_DIR/kairos/routers/<port>     (else ~/.local/state/kairos/routers/<port>)

``kairosd`` and ``id-tracker`` pointed at a loopback router URL look there when
no credential was configured explicitly. The discovery entry is a symlink, so
it names a directory only the router's user can read: it hands nothing to a
process of another user. Agents are never *given* a credential (id-tracker
removes the variables from their environment); an agent running as the same
user as the router could still read these files, which is why production units
run the router under its own user (docs/deploy.md).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from kairos_common.errors import ConfigError

ADMIN_FILE = "admin.token"
LIFECYCLE_FILE = "lifecycle.token"
DAEMON_KEY_FILE = "daemon.key"
DEFAULT_ROUTER_PORT = 24157
MAX_CREDENTIAL_CHARS = 512
"""Longer bearer values are refused before any comparison (a cheap bound)."""

CREDENTIAL_ENV_VARS = frozenset(
    {
        # id-tracker's lifecycle (or admin) credential
        "KAIROS_CONTROL_TOKEN",
        "KAIROS_CONTROL_TOKEN_FILE",
        # the router's admin credential, signing secret and credential files
        "KAIROS_ROUTER_CONTROL_TOKEN",
        "KAIROS_ROUTER_CONTROL_TOKEN_FILE",
        "KAIROS_ROUTER_SIGNING_SECRET_FILE",
        "KAIROS_ROUTER_CREDENTIALS_DIR",
        # the router's shared store: redis://:PASSWORD@host carries Redis AUTH
        "KAIROS_ROUTER_STORE",
        # a daemon's credential
        "KAIROSD_ROUTER_TOKEN",
        "KAIROSD_ROUTER_TOKEN_FILE",
    }
)
"""Every environment variable through which a Kairos program reads a control
credential, a signing secret or where one lives. None of them ever reaches an
agent process: id-tracker removes them all from the child's environment, tagged
or untagged (idtracker/env.py); tests/idtracker/test_no_credentials.py checks
that every credential-like key of the three configuration schemas is listed."""


def daemon_file(instance: str) -> str:
    """The file name of one instance's daemon credential."""
    return f"daemon-{instance}.token"


def safe_instance_file_name(instance: str) -> bool:
    """Whether ``instance`` can name a credential file (no path tricks)."""
    return (
        bool(instance)
        and len(instance) <= 128
        and all(c.isascii() and (c.isalnum() or c in "._-") for c in instance)
        and not instance.startswith(".")
    )


def discovery_root(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_RUNTIME_DIR/kairos/routers``, else ``$XDG_STATE_HOME/kairos/routers``."""
    env = os.environ if env is None else env
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "kairos" / "routers"
    state = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local/state")
    return Path(state) / "kairos" / "routers"


def default_router_credentials_dir(env: Mapping[str, str] | None = None) -> Path:
    """The credentials of a router started with its default state directory."""
    env = os.environ if env is None else env
    state = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local/state")
    return Path(state) / "kairos" / "router" / "credentials"


def _loopback_port(router_url: str) -> int | None:
    """The port of a loopback router URL (None for other hosts: no local discovery)."""
    try:
        parts = urlsplit(router_url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if host is None:
        return None
    if host != "localhost":
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return None
        except ValueError:
            return None
    return port or (443 if parts.scheme == "https" else 80)


def read_credential(path: Path) -> str:
    """The credential in ``path`` (stripped); :class:`ConfigError` when unusable.

    The one reader of token files for every component (router, kairosd,
    id-tracker), so they agree on one rule: an unreadable, empty, over-long or
    non-printable file is a configuration error, never "no credential". The
    message names the file, never its contents.
    """
    try:
        value = path.expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read credential file {path}: {exc}") from None
    if not value:
        raise ConfigError(f"credential file {path} is empty")
    if len(value) > MAX_CREDENTIAL_CHARS or not value.isascii() or not value.isprintable():
        raise ConfigError(f"credential file {path} does not hold a printable ASCII token")
    return value


def discover_credential(
    router_url: str, file_name: str, env: Mapping[str, str] | None = None
) -> str | None:
    """The credential ``file_name`` a local router published, or None.

    Looks in the router's discovery entry for the URL's port, then, for the
    default port, in the default router state directory (a router started by the
    README's plain command, possibly in another login session).
    """
    port = _loopback_port(router_url)
    if port is None:
        return None
    folders = [discovery_root(env) / str(port)]
    if port == DEFAULT_ROUTER_PORT:
        folders.append(default_router_credentials_dir(env))
    for folder in folders:
        path = folder / file_name
        if path.is_file():
            try:
                return read_credential(path)
            except ConfigError:
                continue
    return None
