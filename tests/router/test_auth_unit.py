"""Control-plane authentication by role: admin, lifecycle, per-instance daemon (design.md §9)."""

from __future__ import annotations

import errno
import stat
import subprocess
import sys
from pathlib import Path
from unittest.mock import Mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from kairos_common.credentials import discover_credential
from kairos_common.errors import ConfigError
from router.auth import ControlAuth, Role
from router.errors import AuthenticationError, ForbiddenError
from router.secrets_store import RouterCredentials


def _request(peer: str, headers: dict[str, str] | None = None) -> web.Request:
    transport = Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 12345) if name == "peername" else default
    )
    return make_mocked_request("POST", "/kairos/v1/agents", headers=headers, transport=transport)


def _bearer(value: str | bytes) -> dict[str, str]:
    text = value.decode() if isinstance(value, bytes) else value
    return {"Authorization": f"Bearer {text}"}


@pytest.fixture
def creds(tmp_path: Path) -> RouterCredentials:
    return RouterCredentials(tmp_path / "credentials")


@pytest.fixture
def auth(creds: RouterCredentials) -> ControlAuth:
    return ControlAuth(creds, lambda: ["i0", "i1"])


def test_default_install_writes_private_credential_files(tmp_path: Path) -> None:
    creds = RouterCredentials(tmp_path / "c")
    creds.write_daemon_file("i0")
    folder = tmp_path / "c"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["admin.token", "daemon-i0.token", "daemon.key", "lifecycle.token"]
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # Restart: the same credentials (kairosd and id-tracker keep theirs).
    again = RouterCredentials(folder)
    assert again.admin == creds.admin and again.lifecycle == creds.lifecycle
    assert again.daemon_token("i0") == creds.daemon_token("i0")
    assert (folder / "daemon-i0.token").read_text().strip() == creds.daemon_token("i0").decode()


def test_routers_starting_together_on_one_folder_agree_on_its_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two routers of a pair on one host share a credentials folder. Both can find
    it empty (neither has written yet); the second must take the first's files,
    not overwrite them while the first keeps its own in memory (CI saw the pair's
    id-tracker refused with the file's lifecycle credential)."""
    folder = tmp_path / "c"
    monkeypatch.setattr(Path, "is_file", lambda self: False)  # both look before either writes
    first = RouterCredentials(folder)
    second = RouterCredentials(folder)
    assert second.admin == first.admin and second.lifecycle == first.lifecycle
    assert second.daemon_token("i0") == first.daemon_token("i0")
    monkeypatch.undo()
    assert (folder / "lifecycle.token").read_text().strip() == first.lifecycle.decode()
    # No private temporaries left behind.
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["admin.token", "daemon.key", "lifecycle.token"]


def test_configured_admin_token_wins_and_names_unfit_for_files_are_skipped(
    tmp_path: Path,
) -> None:
    creds = RouterCredentials(tmp_path / "c", admin_token="op-token")
    assert creds.admin == b"op-token"
    creds.write_daemon_file("../evil")
    assert not (tmp_path / "evil.token").exists()
    assert not any("evil" in p.name for p in (tmp_path / "c").iterdir())


@pytest.mark.parametrize("peer", ["127.0.0.1", "::1", "10.0.0.7"])
def test_writes_need_a_credential_even_from_loopback(auth: ControlAuth, peer: str) -> None:
    with pytest.raises(AuthenticationError):
        auth.require(_request(peer), Role.LIFECYCLE, Role.ADMIN)


def test_each_role_is_identified(auth: ControlAuth, creds: RouterCredentials) -> None:
    admin = auth.require(_request("10.0.0.7", _bearer(creds.admin)), Role.ADMIN)
    assert admin.role is Role.ADMIN
    life = auth.require(_request("::1", _bearer(creds.lifecycle)), Role.LIFECYCLE)
    assert life.role is Role.LIFECYCLE
    daemon = auth.require(_request("::1", _bearer(creds.daemon_token("i1"))), Role.DAEMON)
    assert (daemon.role, daemon.instance) == (Role.DAEMON, "i1")


def test_wrong_role_is_forbidden(auth: ControlAuth, creds: RouterCredentials) -> None:
    with pytest.raises(ForbiddenError):  # a lifecycle credential cannot administer
        auth.require(_request("127.0.0.1", _bearer(creds.lifecycle)), Role.ADMIN)
    with pytest.raises(ForbiddenError):  # a daemon cannot start agents
        auth.require(
            _request("127.0.0.1", _bearer(creds.daemon_token("i0"))), Role.LIFECYCLE, Role.ADMIN
        )
    with pytest.raises(ForbiddenError):  # the admin cannot post decisions
        auth.require(_request("127.0.0.1", _bearer(creds.admin)), Role.DAEMON)


def test_daemon_credentials_differ_per_instance(creds: RouterCredentials) -> None:
    assert creds.daemon_token("i0") != creds.daemon_token("i1")
    assert creds.daemon_token("i0") not in (creds.admin, creds.lifecycle)


@pytest.mark.parametrize(
    "header",
    [
        "Bearer wrong",
        "Basic abc",
        "Bearer ",
        "Bearer é-non-ascii",
        "Bearer \x7f",
        "Bearer " + "x" * 10_000,
        "token-without-scheme",
    ],
)
def test_malformed_or_wrong_credentials_are_401_not_500(auth: ControlAuth, header: str) -> None:
    with pytest.raises(AuthenticationError):
        auth.require(_request("127.0.0.1", {"Authorization": header}), Role.ADMIN)
    with pytest.raises(AuthenticationError):
        auth.require_read(_request("127.0.0.1", {"Authorization": header}))


def test_agent_identity_key_is_not_a_credential(auth: ControlAuth) -> None:
    from kairos_common.identity import compose_key, issue_token

    key = compose_key(issue_token("agent-1", b"k" * 32), "sk-user")
    with pytest.raises(AuthenticationError):
        auth.require(_request("127.0.0.1", _bearer(key)), Role.LIFECYCLE)


def test_reads_open_to_loopback_only_without_credential(
    auth: ControlAuth, creds: RouterCredentials
) -> None:
    auth.require_read(_request("127.0.0.1"))
    with pytest.raises(ForbiddenError):
        auth.require_read(_request("10.0.0.7"))
    auth.require_read(_request("10.0.0.7", _bearer(creds.daemon_token("i0"))))


def test_published_credentials_are_found_by_port_and_removed(tmp_path: Path) -> None:
    env = {"XDG_RUNTIME_DIR": str(tmp_path), "HOME": str(tmp_path / "home")}
    creds = RouterCredentials(tmp_path / "state" / "credentials")
    creds.write_daemon_file("i0")
    url = "http://127.0.0.1:4321"
    assert discover_credential(url, "lifecycle.token", env) is None
    creds.publish(4321, env)
    assert discover_credential(url, "lifecycle.token", env) == creds.lifecycle.decode()
    assert discover_credential("http://localhost:4321/v1", "daemon-i0.token", env) is not None
    # Never for a remote router, nor another port.
    assert discover_credential("http://10.1.2.3:4321", "lifecycle.token", env) is None
    assert discover_credential("http://127.0.0.1:4322", "lifecycle.token", env) is None
    creds.unpublish()
    assert discover_credential(url, "lifecycle.token", env) is None


def test_credentials_from_a_read_only_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A systemd credentials directory or a Kubernetes Secret volume is read-only: the
    router uses the files the operator put there (shared by a pair and by cells)."""
    folder = tmp_path / "secret-volume"
    folder.mkdir()
    for name, value in (("admin.token", "adm"), ("lifecycle.token", "life"), ("daemon.key", "dk")):
        (folder / name).write_text(value + "\n")

    def read_only(*_args: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("router.secrets_store.os.chmod", read_only)
    creds = RouterCredentials(folder)
    assert (creds.admin, creds.lifecycle) == (b"adm", b"life")
    with pytest.raises(ConfigError):  # a folder it had to create itself must be private
        RouterCredentials(tmp_path / "new")


def test_daemon_token_command_prints_what_the_router_accepts(tmp_path: Path) -> None:
    """``kairos-router daemon-token`` gives a GPU host its kairosd credential from the
    shared daemon.key (a pair's, or every cell's), without writing anything."""
    creds = RouterCredentials(tmp_path / "c")
    before = sorted(p.name for p in (tmp_path / "c").iterdir())
    tool = Path(sys.executable).parent / "kairos-router"
    done = subprocess.run(
        [str(tool), "daemon-token", "gpu0", "--credentials-dir", str(tmp_path / "c")],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().encode() == creds.daemon_token("gpu0")
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == before
