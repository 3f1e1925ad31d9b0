"""The child environment and the configuration, in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from idtracker import config as config_mod
from idtracker.env import child_env, default_agent_name, parent_agent_id, real_keys
from idtracker.errors import ConfigurationError
from kairos_common.identity import compose_key, issue_token, parse_key

ROUTER = "http://127.0.0.1:24157"
TOKEN = issue_token("agent-1", b"k" * 32)


def _env(parent: dict[str, str]) -> dict[str, str]:
    return child_env(
        parent, router_url=ROUTER, agent_id="agent-1", token=TOKEN, keys=real_keys(parent)
    )


def test_base_urls_for_openai_litellm_and_anthropic_clients() -> None:
    env = _env({"PATH": "/bin", "OPENAI_BASE_URL": "http://vllm:8000/v1"})
    assert env["PATH"] == "/bin"  # the parent environment survives
    for var in ("OPENAI_BASE_URL", "OPENAI_API_BASE", "HOSTED_VLLM_API_BASE"):
        assert env[var] == f"{ROUTER}/v1"
    assert "ANTHROPIC_BASE_URL" not in env  # Anthropic is a cloud provider unless told
    assert env["KAIROS_AGENT_ID"] == "agent-1" and env["KAIROS_ROUTER_URL"] == ROUTER
    env = _env({"ANTHROPIC_BASE_URL": ROUTER + "/"})
    assert env["ANTHROPIC_BASE_URL"] == ROUTER  # the SDK appends /v1/messages itself


def test_each_key_variable_keeps_its_own_real_key() -> None:
    env = _env(
        {"OPENAI_API_KEY": "sk-openai", "ANTHROPIC_API_KEY": "sk-ant", "ANTHROPIC_BASE_URL": ROUTER}
    )
    assert parse_key(env["OPENAI_API_KEY"]).real_key == "sk-openai"
    assert parse_key(env["ANTHROPIC_API_KEY"]).real_key == "sk-ant"
    # an unset OpenAI-compatible variable takes the other one's key (same endpoint),
    # so LiteLLM's hosted_vllm works too
    hosted = parse_key(env["HOSTED_VLLM_API_KEY"])
    assert hosted.agent_id == "agent-1" and hosted.real_key == "sk-openai"
    assert "ANTHROPIC_AUTH_TOKEN" not in env


def test_a_cloud_key_never_moves_to_the_router() -> None:
    """An Anthropic key must not reach vLLM through an OpenAI variable, nor
    through a redirected Anthropic base URL."""
    env = _env({"ANTHROPIC_API_KEY": "sk-ant-cloud", "PATH": "/bin"})
    assert env["ANTHROPIC_API_KEY"] == "sk-ant-cloud"  # untouched, still the cloud's
    assert "ANTHROPIC_BASE_URL" not in env
    for var in ("OPENAI_API_KEY", "HOSTED_VLLM_API_KEY"):
        assert parse_key(env[var]).real_key is None
    pointed = _env({"OPENAI_API_KEY": "sk-vllm", "ANTHROPIC_BASE_URL": ROUTER})
    assert parse_key(pointed["ANTHROPIC_API_KEY"]).real_key is None  # not the OpenAI key


def test_control_credentials_never_reach_the_agent() -> None:
    env = _env({"KAIROS_CONTROL_TOKEN": "ctl", "KAIROS_CONTROL_TOKEN_FILE": "/x", "A": "b"})
    assert "KAIROS_CONTROL_TOKEN" not in env and "KAIROS_CONTROL_TOKEN_FILE" not in env
    assert env["A"] == "b"


def test_no_real_key_at_all_still_carries_identity() -> None:
    parsed = parse_key(_env({})["OPENAI_API_KEY"])
    assert parsed.agent_id == "agent-1" and parsed.real_key is None


def test_anthropic_auth_token_rewritten_and_api_key_not_added_next_to_it() -> None:
    env = _env({"ANTHROPIC_AUTH_TOKEN": "sk-bearer", "ANTHROPIC_BASE_URL": ROUTER})
    assert parse_key(env["ANTHROPIC_AUTH_TOKEN"]).real_key == "sk-bearer"
    assert "ANTHROPIC_API_KEY" not in env


def test_nested_keys_are_unwrapped_not_nested() -> None:
    parent_key = compose_key(issue_token("parent", None), "sk-user")
    env = _env({"OPENAI_API_KEY": parent_key, "KAIROS_AGENT_ID": "parent"})
    parsed = parse_key(env["OPENAI_API_KEY"])
    assert (parsed.agent_id, parsed.real_key) == ("agent-1", "sk-user")
    assert env["OPENAI_API_KEY"].count("kairos1.") == 1


def test_malformed_inherited_identity_key_is_a_config_error() -> None:
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        real_keys({"OPENAI_API_KEY": "kairos1.bad key.x.y"})


@pytest.mark.parametrize(
    ("value", "expected"),
    [("abc-123", "abc-123"), ("", None), ("not valid!", None), ("  x_y  ", "x_y")],
)
def test_parent_agent_id(value: str, expected: str | None) -> None:
    assert parent_agent_id({"KAIROS_AGENT_ID": value}) == expected


@pytest.mark.parametrize(
    ("cmd", "name"),
    [
        (["harbor", "run", "--agent", "x"], "harbor"),
        (["/usr/bin/python3", "-u", "agent.py"], "python3 agent.py"),
        (["python", "-m", "minisweagent.run"], "python -m minisweagent.run"),
        (["node"], "node"),
    ],
)
def test_default_agent_name(cmd: list[str], name: str) -> None:
    assert default_agent_name(cmd) == name


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("http://127.0.0.1:24157/", "http://127.0.0.1:24157"),
        ("http://router:24157/v1", "http://router:24157"),
        ("https://gw.example/kairos/", "https://gw.example/kairos"),
    ],
)
def test_router_url_normalised(url: str, normal: str) -> None:
    assert config_mod.normalise_router_url(url) == normal


@pytest.mark.parametrize("bad", ["127.0.0.1:24157", "ftp://x", "http://", "http://h:99999"])
def test_bad_router_url_rejected(bad: str) -> None:
    with pytest.raises(ConfigurationError):
        config_mod.normalise_router_url(bad)


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    cfg_file = tmp_path / "id-tracker.toml"
    cfg_file.write_text('router_url = "http://file:1"\nkill_grace_s = 3.0\n')
    env = {"KAIROS_ROUTER_URL": "http://env:2"}
    cfg = config_mod.load(path=cfg_file, env=env, overrides={"router_url": None})
    assert (cfg.router_url, cfg.kill_grace_s) == (("http://env:2",), 3.0)
    cfg = config_mod.load(path=cfg_file, env=env, overrides={"router_url": "http://flag:3"})
    assert cfg.router_url == ("http://flag:3",)
    assert config_mod.load(path=None, env={}).router_url == (config_mod.DEFAULT_ROUTER_URL,)


def test_several_router_urls_from_flag_env_and_file(tmp_path: Path) -> None:
    """One URL stays the single-URL contract; several come as a TOML list, a
    comma-separated KAIROS_ROUTER_URL (what a nested id-tracker inherits) or
    repeated flags; normalised, duplicates dropped, the operator's order kept."""
    cfg_file = tmp_path / "id-tracker.toml"
    cfg_file.write_text('router_url = ["http://a:1/v1", "http://b:2"]\n')
    cfg = config_mod.load(path=cfg_file, env={})
    assert config_mod.normalise_router_urls(cfg.router_url) == ("http://a:1", "http://b:2")
    env = {"KAIROS_ROUTER_URL": "http://b:2, http://a:1/,http://b:2"}
    cfg = config_mod.load(path=cfg_file, env=env)
    assert config_mod.normalise_router_urls(cfg.router_url) == ("http://b:2", "http://a:1")
    with pytest.raises(ConfigurationError):
        config_mod.normalise_router_urls(("http://a:1", "ftp://b"))


def test_config_file_found_in_xdg_dir(tmp_path: Path) -> None:
    (tmp_path / "kairos").mkdir()
    (tmp_path / "kairos" / "id-tracker.toml").write_text("fail_open = true\n")
    assert config_mod.load(path=None, env={"XDG_CONFIG_HOME": str(tmp_path)}).fail_open


def test_config_typo_and_bad_values_are_errors(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text("router_ulr = 'x'\n")
    with pytest.raises(ConfigurationError, match="router_ulr"):
        config_mod.load(path=cfg_file, env={})
    with pytest.raises(ConfigurationError, match="negative"):
        config_mod.load(path=None, env={"KAIROS_KILL_GRACE_S": "-1"})


def test_control_token_sources(tmp_path: Path) -> None:
    token_file = tmp_path / "t"
    token_file.write_text(" tok \n")
    cfg = config_mod.IdTrackerConfig(control_token_file=token_file)
    assert config_mod.resolve_control_token(cfg) == "tok"
    home = {"HOME": str(tmp_path / "home")}
    assert config_mod.resolve_control_token(config_mod.IdTrackerConfig(), home) is None
    missing = config_mod.IdTrackerConfig(control_token_file=tmp_path / "none")
    with pytest.raises(ConfigurationError, match="cannot read"):
        config_mod.resolve_control_token(missing)
