"""The shipped systemd units: parser-level checks (always) and ``systemd-analyze verify``.

Nothing here needs root or starts a unit: files are read, command lines are parsed
by the real CLIs, and ``systemd-analyze verify`` loads copies in a temporary
directory whose install prefix points at this checkout's console scripts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kairos_common.config import load_config
from kairosd.config import ENV_PREFIX as KAIROSD_ENV
from kairosd.config import KairosdConfig
from kairosd.service import EXIT_CONFIG, EXIT_NO_CONTROL
from tests.deploy.cli_check import parse
from tests.deploy.units import (
    CONFIG_DIR,
    DROPIN_FILES,
    DROPINS,
    ETC,
    INSTALL_PREFIX,
    ROOT,
    SYSTEMD,
    UNIT_FILES,
    Unit,
    config_flag,
    etc_source,
    exec_argv,
    parse_unit,
    read_env_file,
    seconds,
)

OUR_PROGRAMS = {"kairosd", "kairos-router"}
EXEC_KEYS = ("ExecStart", "ExecStartPre", "ExecStartPost", "ExecStop", "ExecStopPost")


def unit(name: str) -> Unit:
    return parse_unit(SYSTEMD / name)


def example_kairosd_configs() -> list[KairosdConfig]:
    return [
        load_config(KairosdConfig, path=p, env_prefix=KAIROSD_ENV, env={})
        for p in sorted(ETC.glob("kairosd-*.toml"))
    ]


def test_the_expected_files_are_shipped() -> None:
    names = {p.name for p in UNIT_FILES}
    assert {"kairosd@.service", "kairos-router.service", "vllm@.service"} <= names
    assert {p.name for p in DROPIN_FILES} >= {
        "kairosd-zeusd.conf",
        "kairos-control-token.conf",
        "kairosd-router-credential.conf",
    }


@pytest.mark.parametrize("path", UNIT_FILES + DROPIN_FILES, ids=lambda p: p.name)
def test_every_unit_file_parses_with_its_required_keys(path: Path) -> None:
    u = parse_unit(path)
    assert set(u.sections) <= {"Unit", "Service", "Install"}, u.sections.keys()
    if path.suffix == ".service":
        assert u.one("Unit", "Description")
        assert u.one("Service", "Type") in ("notify", "exec", "simple")
        assert u.one("Service", "Restart") == "on-failure"
        assert u.one("Install", "WantedBy") == "multi-user.target"
        argv = exec_argv(u.one("Service", "ExecStart"))
        assert argv[0].startswith(INSTALL_PREFIX), "binaries live at the documented prefix"
    for key in EXEC_KEYS:
        for command in u.get("Service", key):
            assert exec_argv(command)[0].startswith("/"), f"{key} needs an absolute path"


def our_exec_lines() -> list[tuple[str, str, str]]:
    out = []
    for path in UNIT_FILES + DROPIN_FILES:
        u = parse_unit(path)
        for key in EXEC_KEYS:
            for command in u.get("Service", key):
                argv = exec_argv(command)
                if Path(argv[0]).name in OUR_PROGRAMS:
                    out.append((path.name, key, command))
    return out


@pytest.mark.parametrize("where,key,command", our_exec_lines())
def test_every_kairos_command_in_a_unit_parses_with_the_real_cli(
    where: str, key: str, command: str
) -> None:
    argv = exec_argv(command)
    path = parse(Path(argv[0]).name, argv[1:])
    assert len(path) == 2, f"{where} {key}: no subcommand in {command!r}"


def test_kairosd_unit_is_notify_with_a_watchdog_the_daemon_can_feed() -> None:
    u = unit("kairosd@.service")
    assert u.one("Service", "Type") == "notify"
    assert u.one("Service", "NotifyAccess") == "main"
    watchdog_s = seconds(u.one("Service", "WatchdogSec"))
    # The daemon pings WATCHDOG=1 once per epoch; docs/kairosd.md asks for >= 3 epochs.
    for cfg in [KairosdConfig(), *example_kairosd_configs()]:
        assert watchdog_s >= 3 * cfg.epoch_s, (watchdog_s, cfg.epoch_s)
        # One slow epoch (both inputs time out) must not trip it either.
        assert watchdog_s > cfg.epoch_s + cfg.http_timeout_s + cfg.gpu_timeout_s
    assert seconds(u.one("Service", "TimeoutStartSec")) >= 30


def test_kairosd_unit_resets_clocks_after_every_stop_with_the_same_config() -> None:
    u = unit("kairosd@.service")
    start = exec_argv(u.one("Service", "ExecStart"))
    stop_post = exec_argv(u.one("Service", "ExecStopPost"))
    assert parse("kairosd", start[1:]) == ["kairosd", "run"]
    assert parse("kairosd", stop_post[1:]) == ["kairosd", "reset"]
    assert not u.one("Service", "ExecStopPost").startswith("-"), "a failed reset must show"
    assert config_flag(start) == config_flag(stop_post) == f"{CONFIG_DIR}kairosd-%i.toml"
    assert etc_source(f"{CONFIG_DIR}kairosd-%i.toml", "gpu0").is_file()
    prevented = set(u.words("Service", "RestartPreventExitStatus"))
    assert {str(EXIT_CONFIG), str(EXIT_NO_CONTROL)} <= prevented


def test_kairosd_unit_orders_after_vllm_and_zeusd() -> None:
    after = unit("kairosd@.service").words("Unit", "After")
    assert "vllm@%i.service" in after
    assert "zeusd.service" in after


def test_kairosd_hardening_keeps_nvml_device_access() -> None:
    u = unit("kairosd@.service")
    assert not u.get("Service", "PrivateDevices"), "NVML needs the real /dev/nvidia* nodes"
    assert u.one("Service", "DevicePolicy") == "closed"
    allowed = u.get("Service", "DeviceAllow")
    assert any(a.split()[0].startswith("char-nvidia") and "rw" in a for a in allowed), allowed
    assert u.one("Service", "CapabilityBoundingSet") == "CAP_SYS_ADMIN"
    assert u.one("Service", "ProtectSystem") == "strict"
    assert u.one("Service", "NoNewPrivileges") == "yes"
    # The power reports must land in the unit's (writable) StateDirectory.
    state = f"/var/lib/{u.one('Service', 'StateDirectory')}/"
    for cfg in example_kairosd_configs():
        assert cfg.report_path is not None and str(cfg.report_path).startswith(state)


def test_zeusd_dropin_runs_kairosd_unprivileged_through_zeusd() -> None:
    d = parse_unit(SYSTEMD / "dropins" / "kairosd-zeusd.conf")
    assert d.one("Service", "User") not in ("", "root", "0")
    assert "zeusd.service" in d.words("Unit", "Requires")
    assert "zeusd.service" in d.words("Unit", "After")
    assert d.one("Service", "CapabilityBoundingSet") == ""
    env = dict(e.split("=", 1) for e in d.get("Service", "Environment"))
    assert env["ZEUSD_SOCK_PATH"].startswith("/run/")


def test_credential_dropins_give_each_program_its_own_role() -> None:
    """docs/design.md §9: the admin token goes to the router only; each kairosd gets the daemon
    credential of its own instance (%i), from the router's state directory."""
    from router.config import ENV_PREFIX as ROUTER_ENV

    d = parse_unit(SYSTEMD / "dropins" / "kairos-control-token.conf")
    name, _, source = d.one("Service", "LoadCredential").partition(":")
    assert source.startswith(CONFIG_DIR)
    env = dict(e.split("=", 1) for e in d.get("Service", "Environment"))
    assert env == {f"{ROUTER_ENV}_CONTROL_TOKEN_FILE": f"%d/{name}"}

    k = parse_unit(SYSTEMD / "dropins" / "kairosd-router-credential.conf")
    name, _, source = k.one("Service", "LoadCredential").partition(":")
    router_state = "/var/lib/" + unit("kairos-router.service").one("Service", "StateDirectory")
    assert source == f"{router_state}/credentials/daemon-%i.token"
    env = dict(e.split("=", 1) for e in k.get("Service", "Environment"))
    # The variable must be the one the schema really reads.
    kd = load_config(
        KairosdConfig,
        env_prefix=KAIROSD_ENV,
        env={kk: v.replace("%d", "/run/credentials/x") for kk, v in env.items()},
    )
    assert str(kd.router_token_file) == f"/run/credentials/x/{name}"


def test_router_unit_keeps_state_in_its_state_directory() -> None:
    u = unit("kairos-router.service")
    argv = exec_argv(u.one("Service", "ExecStart"))
    assert parse("kairos-router", argv[1:]) == ["kairos-router", "run"]
    state_dir = argv[argv.index("--state-dir") + 1]
    assert state_dir == f"/var/lib/{u.one('Service', 'StateDirectory')}"
    assert u.one("Service", "DynamicUser") == "yes" or u.get("Service", "User")
    assert config_flag(argv) == f"{CONFIG_DIR}kairos-router.toml"
    assert etc_source(config_flag(argv) or "", "").is_file()
    assert u.one("Service", "PrivateDevices") == "yes"
    assert u.one("Service", "CapabilityBoundingSet") == ""


def test_vllm_unit_exports_metrics_and_takes_its_gpus_from_the_env_file() -> None:
    u = unit("vllm@.service")
    command = u.one("Service", "ExecStart")
    argv = exec_argv(command)
    assert argv[1] == "serve"
    assert "--disable-log-stats" not in argv, "kairosd and the router read vLLM /metrics"
    assert {"--enable-prompt-tokens-details", "--enable-prefix-caching", "--port"} <= set(argv)
    env_file = u.one("Service", "EnvironmentFile")
    assert env_file == f"{CONFIG_DIR}vllm-%i.env"
    env = read_env_file(etc_source(env_file, "gpu0"))
    assert env["CUDA_VISIBLE_DEVICES"] and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    referenced = set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", command))
    assert referenced <= set(env), f"ExecStart uses variables the env file lacks: {referenced}"


# ---- systemd-analyze verify ------------------------------------------------------

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")


def _stage(tmp: Path, dropins: dict[str, list[str]]) -> list[str]:
    """Copy the units into ``tmp`` with the install prefix pointing at this
    environment's console scripts (``vllm`` is a stub), plus the given drop-ins."""
    venv_bin = Path(sys.executable).parent
    stubs = tmp / "stub-bin"
    stubs.mkdir()
    vllm = stubs / "vllm"
    vllm.write_text("#!/bin/sh\nexit 0\n")
    vllm.chmod(0o755)
    for program in OUR_PROGRAMS:
        assert (venv_bin / program).is_file(), f"{program} console script not installed"
    for path in UNIT_FILES:
        text = path.read_text(encoding="utf-8")
        text = text.replace(f"{INSTALL_PREFIX}vllm", f"{stubs}/vllm")
        (tmp / path.name).write_text(text.replace(INSTALL_PREFIX, f"{venv_bin}/"))
    for unit_name, confs in dropins.items():
        ddir = tmp / f"{unit_name}.d"
        ddir.mkdir()
        for conf in confs:
            shutil.copy(SYSTEMD / "dropins" / conf, ddir / conf)
    # A stand-in for zeusd's own unit, so Requires=zeusd.service resolves.
    (tmp / "zeusd.service").write_text("[Service]\nExecStart=/bin/true\n")
    return [
        str(tmp / "kairosd@gpu0.service"),
        str(tmp / "kairos-router.service"),
        str(tmp / "vllm@gpu0.service"),
    ]


def _verify(paths: list[str]) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run(
        [ANALYZE, "verify", "--man=no", *paths],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


VARIANTS = {
    "root": {},
    "zeusd": {"kairosd@.service": ["kairosd-zeusd.conf"]},
    "credentials": {
        "kairosd@.service": ["kairosd-router-credential.conf"],
        "kairos-router.service": ["kairos-control-token.conf"],
    },
    "pair": {"kairos-router.service": ["kairos-router-pair.conf"]},
}


@needs_analyze
@pytest.mark.parametrize("variant", VARIANTS)
def test_systemd_analyze_verify_is_clean(variant: str, tmp_path: Path) -> None:
    result = _verify(_stage(tmp_path, VARIANTS[variant]))
    # Unknown keys and bad values are only warnings (exit 0): any output fails.
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


DEBIAN_HAPROXY_UNIT = Path("/lib/systemd/system/haproxy.service")


@needs_analyze
@pytest.mark.skipif(
    not DEBIAN_HAPROXY_UNIT.is_file() or shutil.which("haproxy") is None,
    reason="Debian's haproxy package is not installed (make test installs it)",
)
def test_haproxy_dropin_verifies_on_debians_unit(tmp_path: Path) -> None:
    """The front's drop-in on the unit Debian's haproxy 2.6 package ships."""
    shutil.copy(DEBIAN_HAPROXY_UNIT, tmp_path / "haproxy.service")
    (tmp_path / "haproxy.service.d").mkdir()
    shutil.copy(DROPINS / "haproxy-kairos.conf", tmp_path / "haproxy.service.d" / "kairos.conf")
    result = _verify([str(tmp_path / "haproxy.service")])
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_pair_dropin_hands_the_router_its_shared_credentials() -> None:
    """Every router of a pair (and of every cell) reads the same credential files, as
    systemd credentials, through the variables the router's schema really reads."""
    from router.config import ENV_PREFIX as ROUTER_ENV
    from router.config import RouterConfig

    d = parse_unit(DROPINS / "kairos-router-pair.conf")
    loaded = dict(c.split(":", 1) for c in d.get("Service", "LoadCredential"))
    assert set(loaded) == {"admin.token", "lifecycle.token", "daemon.key", "signing.key"}
    assert all(source == f"{CONFIG_DIR}credentials/{name}" for name, source in loaded.items())
    env = dict(e.split("=", 1) for e in d.get("Service", "Environment"))
    cfg = load_config(
        RouterConfig,
        env_prefix=ROUTER_ENV,
        env={k: v.replace("%d", "/run/credentials/x") for k, v in env.items()},
    )
    assert cfg.resolved_credentials_dir() == Path("/run/credentials/x")
    assert cfg.signing_secret_file == Path("/run/credentials/x/signing.key")


def test_haproxy_dropin_reads_the_documented_environment_file() -> None:
    d = parse_unit(DROPINS / "haproxy-kairos.conf")
    assert d.one("Service", "EnvironmentFile") == f"{CONFIG_DIR}haproxy-kairos.env"
    assert d.one("Service", "User") == "haproxy"
    runtime = d.one("Service", "RuntimeDirectory")
    env = read_env_file(ROOT / "deploy" / "haproxy" / "cells.env")
    assert env["PIDFILE"].startswith(f"/run/{runtime}/")
    assert env["CONFIG"] == "/etc/haproxy/kairos/cells.cfg"


@needs_analyze
def test_systemd_analyze_verify_catches_a_typo(tmp_path: Path) -> None:
    """Guards the check above against passing vacuously."""
    paths = _stage(tmp_path, {})
    broken = Path(paths[0].replace("@gpu0", "@"))
    broken.write_text(broken.read_text().replace("WatchdogSec=", "WatchdogSecs="))
    result = _verify(paths[:1])
    assert "WatchdogSecs" in result.stderr
