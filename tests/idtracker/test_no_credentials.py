"""No control credential ever reaches an agent (docs/design.md §9), on any path that
builds the child's environment: tagged, untagged under ``--fail-open`` (router down,
or refusing the credential), and through a nested id-tracker. id-tracker runs as a
real process; the agent prints its whole environment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from idtracker.config import ENV_PREFIX as IDTRACKER_ENV
from idtracker.config import IdTrackerConfig
from idtracker.env import child_env, without_credentials
from idtracker.testing import StandInRouter
from kairos_common.config import config_reference
from kairos_common.credentials import CREDENTIAL_ENV_VARS
from kairosd.config import ENV_PREFIX as KAIROSD_ENV
from kairosd.config import KairosdConfig
from router.config import ENV_PREFIX as ROUTER_ENV
from router.config import RouterConfig
from tests.idtracker.conftest import run_tracker, tracker_cmd

TOKEN = "ctl-" + "5e" * 16  # the lifecycle credential id-tracker is given
OTHERS = {  # credentials of the other programs, exported in the same shell
    "KAIROS_ROUTER_CONTROL_TOKEN": "adm-" + "a1" * 16,
    "KAIROS_ROUTER_CONTROL_TOKEN_FILE": "/etc/kairos/control-token",
    "KAIROS_ROUTER_SIGNING_SECRET_FILE": "/var/lib/kairos-router/signing.key",
    "KAIROS_ROUTER_CREDENTIALS_DIR": "/var/lib/kairos-router/credentials",
    "KAIROS_ROUTER_STORE": "redis://:redis-" + "c3" * 16 + "@10.0.1.10:6379/0",
    "KAIROSD_ROUTER_TOKEN": "dmn-" + "b2" * 16,
    "KAIROSD_ROUTER_TOKEN_FILE": "/etc/kairos/daemon.token",
}
SHOW_ENV = ["env"]
_CREDENTIAL_LIKE = re.compile(
    r"(?<!PER_)(TOKEN|SECRET|CREDENTIALS?|PASSWORD|PASSWD)(_FILE|_DIR)?$|_STORE$"
)  # a store URL may carry the Redis password


def _schema_env_names() -> list[str]:
    names = []
    for schema, prefix in (
        (IdTrackerConfig, IDTRACKER_ENV),
        (RouterConfig, ROUTER_ENV),
        (KairosdConfig, KAIROSD_ENV),
    ):
        for key, _type, _default in config_reference(schema):
            names.append(f"{prefix}_{key.upper().replace('.', '__')}")
    return names


def test_every_credential_variable_of_every_program_is_listed() -> None:
    """A new credential key in any schema must be added to CREDENTIAL_ENV_VARS, or
    id-tracker would hand it to agents."""
    credential_like = {n for n in _schema_env_names() if _CREDENTIAL_LIKE.search(n)}
    assert credential_like, "the schemas have credential keys"
    assert credential_like <= CREDENTIAL_ENV_VARS, credential_like - CREDENTIAL_ENV_VARS
    assert set(OTHERS) | {"KAIROS_CONTROL_TOKEN", "KAIROS_CONTROL_TOKEN_FILE"} <= (
        CREDENTIAL_ENV_VARS
    )


def _child_env(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def _assert_clean(env: dict[str, str]) -> None:
    assert not set(env) & CREDENTIAL_ENV_VARS, set(env) & CREDENTIAL_ENV_VARS
    for secret in (TOKEN, *OTHERS.values()):
        leaks = [name for name, value in env.items() if secret in value]
        assert not leaks, f"{secret[:4]}… reached the agent in {leaks}"


@pytest.fixture
def loaded_env(base_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A shell with every credential exported, and one copied into a user variable."""
    env = {**base_env, **OTHERS, "KAIROS_CONTROL_TOKEN": TOKEN}
    env["MY_COPY"] = f"Bearer {TOKEN}"  # e.g. MY_COPY="Bearer $(cat lifecycle.token)"
    return env


def test_tagged_agent_gets_no_credential(loaded_env: dict[str, str]) -> None:
    with StandInRouter(control_token=TOKEN) as router:
        done = run_tracker(router.url, loaded_env, SHOW_ENV)
        assert done.returncode == 0, done.stderr
        assert len(router.starts) == 1  # it did use the credential itself
    env = _child_env(done.stdout)
    assert env["KAIROS_AGENT_ID"] == router.starts[0].agent_id
    assert "MY_COPY" not in env
    assert "MY_COPY" in done.stderr and TOKEN not in done.stderr  # logged by name only
    _assert_clean(env)


def test_fail_open_with_no_router_gets_no_credential(loaded_env: dict[str, str]) -> None:
    router = StandInRouter()
    router.start()
    dead = router.url
    router.stop()
    done = run_tracker(dead, loaded_env, SHOW_ENV, "--fail-open", "--start-timeout-s", "0.2")
    assert done.returncode == 0, done.stderr
    env = _child_env(done.stdout)
    assert "KAIROS_AGENT_ID" not in env  # untagged
    assert env["OPENAI_API_KEY"] == loaded_env["OPENAI_API_KEY"]  # otherwise unchanged
    _assert_clean(env)


def test_fail_open_after_a_refused_credential_gets_no_credential(
    loaded_env: dict[str, str], tmp_path: Path
) -> None:
    token_file = tmp_path / "lifecycle.token"
    token_file.write_text(TOKEN + "\n")
    loaded_env["KAIROS_CONTROL_TOKEN_FILE"] = str(token_file)
    del loaded_env["KAIROS_CONTROL_TOKEN"]
    loaded_env["TOKEN_PATH_COPY"] = str(token_file)  # a path, not the credential: kept
    with StandInRouter(control_token="another") as router:
        done = run_tracker(router.url, loaded_env, SHOW_ENV, "--fail-open")
    assert done.returncode == 0, done.stderr
    env = _child_env(done.stdout)
    assert "KAIROS_AGENT_ID" not in env and env["TOKEN_PATH_COPY"] == str(token_file)
    _assert_clean(env)


def test_nested_id_tracker_child_gets_no_credential(
    loaded_env: dict[str, str], tmp_path: Path
) -> None:
    """The inner id-tracker finds the credential in the config file, as documented;
    neither agent gets it."""
    config = tmp_path / "id-tracker.toml"
    config.write_text(f'control_token = "{TOKEN}"\n')
    loaded_env["KAIROS_IDTRACKER_CONFIG"] = str(config)
    with StandInRouter(control_token=TOKEN) as router:
        done = run_tracker(router.url, loaded_env, tracker_cmd("--", *SHOW_ENV))
        assert done.returncode == 0, done.stderr
        assert len(router.starts) == 2
        assert router.starts[1].start.parent_id == router.starts[0].agent_id
    _assert_clean(_child_env(done.stdout))


def test_without_credentials_drops_by_name_and_by_value() -> None:
    parent = {"KAIROS_CONTROL_TOKEN": TOKEN, "A": f"x{TOKEN}y", "B": "kept", "C": "short"}
    assert without_credentials(parent, [TOKEN]) == {"B": "kept", "C": "short"}
    # A short credential only matches a whole value (it would match by accident).
    assert without_credentials({"C": "short", "D": "shorter"}, ["short"]) == {"D": "shorter"}


def test_child_env_never_passes_a_credential_variable() -> None:
    parent = {name: "v" for name in CREDENTIAL_ENV_VARS} | {"OPENAI_API_KEY": "sk"}
    env = child_env(
        parent,
        router_url="http://127.0.0.1:1",
        agent_id="a",
        token="kairos1.a.-",
        keys={"OPENAI_API_KEY": "sk"},
    )
    assert not set(env) & CREDENTIAL_ENV_VARS
