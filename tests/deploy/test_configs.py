"""Example configs load with the real schemas, agree with each other, and the
configuration reference is the generator's current output."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from idtracker.config import ENV_PREFIX as IDTRACKER_ENV
from idtracker.config import IdTrackerConfig
from kairos_common.config import config_reference, load_config
from kairos_common.errors import ConfigError
from kairosd.config import ENV_PREFIX as KAIROSD_ENV
from kairosd.config import KairosdConfig
from router.config import ENV_PREFIX as ROUTER_ENV
from router.config import RouterConfig, parse_backend
from scripts import gen_config_reference
from tests.deploy.units import ETC, ROOT, read_env_file

SCHEMAS: dict[str, tuple[type, str]] = {
    "kairosd-": (KairosdConfig, KAIROSD_ENV),
    "kairos-router": (RouterConfig, ROUTER_ENV),
    "id-tracker": (IdTrackerConfig, IDTRACKER_ENV),
}


def schema_for(path: Path) -> tuple[type, str]:
    for prefix, schema in SCHEMAS.items():
        if path.name.startswith(prefix):
            return schema
    raise AssertionError(f"{path.name}: no schema known for this example")


def daemons() -> dict[str, KairosdConfig]:
    out = {}
    for p in sorted(ETC.glob("kairosd-*.toml")):
        out[p.stem.removeprefix("kairosd-")] = load_config(
            KairosdConfig, path=p, env_prefix=KAIROSD_ENV, env={}
        )
    return out


def router() -> RouterConfig:
    return load_config(RouterConfig, path=ETC / "kairos-router.toml", env_prefix=ROUTER_ENV, env={})


@pytest.mark.parametrize("path", sorted(ETC.glob("*.toml")), ids=lambda p: p.name)
def test_every_example_toml_loads_with_the_real_schema(path: Path) -> None:
    cls, prefix = schema_for(path)
    cfg: object = load_config(cls, path=path, env_prefix=prefix, env={})
    assert isinstance(cfg, cls)


@pytest.mark.parametrize("path", sorted(ETC.glob("*.env")), ids=lambda p: p.name)
def test_every_example_env_file_sets_only_real_keys(path: Path) -> None:
    env = read_env_file(path)
    assert env, path.name
    if path.name.startswith("vllm-"):
        assert {"CUDA_VISIBLE_DEVICES", "VLLM_MODEL", "VLLM_PORT"} <= set(env)
        return
    cls, prefix = schema_for(path)
    stray = [k for k in env if not k.startswith(f"{prefix}_")]
    assert not stray, f"{path.name}: {stray} are not read by {cls.__name__}"
    # Unknown KAIROSD_* names are silently ignored by the env layer, so compare with
    # the variables the schema really reads (the generated reference's column).
    known = {gen_config_reference.env_name(prefix, key) for key, _, _ in config_reference(cls)}
    assert set(env) <= known, set(env) - known
    load_config(cls, env_prefix=prefix, env=env)


def test_a_typo_in_an_example_would_be_caught(tmp_path: Path) -> None:
    """Guards the loading test: unknown keys are errors, not defaults."""
    bad = tmp_path / "kairosd-x.toml"
    bad.write_text((ETC / "kairosd-gpu0.toml").read_text() + "\nepoch_seconds = 5\n")
    with pytest.raises(ConfigError, match="epoch_seconds"):
        load_config(KairosdConfig, path=bad, env_prefix=KAIROSD_ENV, env={})


def test_instances_agree_across_kairosd_router_and_vllm() -> None:
    r = router()
    backends = dict(parse_backend(spec, i) for i, spec in enumerate(r.backends))
    ds = daemons()
    assert set(ds) == set(backends), "one kairosd example per router backend"
    for name, d in ds.items():
        assert d.instance == name, f"kairosd-{name}.toml must say instance = {name!r}"
        assert d.vllm_url.rstrip("/") == backends[name]
        assert len(d.router_url) == 1
        assert urlsplit(d.router_url[0]).port == r.port
        vllm = read_env_file(ETC / f"vllm-{name}.env")
        assert urlsplit(d.vllm_url).port == int(vllm["VLLM_PORT"])
        visible = tuple(int(g) for g in vllm["CUDA_VISIBLE_DEVICES"].split(","))
        assert d.gpus == visible, f"{name}: kairosd gpus must be vLLM's GPUs"
    ports = [d.listen_port for d in ds.values()]
    assert len(ports) == len(set(ports)), "kairosd /metrics ports must differ per instance"
    gpus = [g for d in ds.values() for g in d.gpus]
    assert len(gpus) == len(set(gpus)), "a GPU belongs to one instance"


def test_idtracker_example_points_at_the_router() -> None:
    cfg = load_config(
        IdTrackerConfig, path=ETC / "id-tracker.toml", env_prefix=IDTRACKER_ENV, env={}
    )
    r = router()
    assert [urlsplit(u).port for u in cfg.router_url] == [r.port]


def test_config_reference_is_current() -> None:
    committed = (ROOT / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert committed == gen_config_reference.render(), (
        "docs/config-reference.md is stale: run python -m scripts.gen_config_reference"
    )


def test_config_reference_lists_every_key_of_every_schema() -> None:
    text = gen_config_reference.render()
    for cls, prefix in SCHEMAS.values():
        for key, _, _ in config_reference(cls):
            assert f"| `{key}` |" in text
            assert f"`{gen_config_reference.env_name(prefix, key)}`" in text


def test_env_names_in_the_reference_are_the_ones_the_loader_reads() -> None:
    """``env_name`` must match ``load_config``'s env layer, nested sections included."""
    env = {
        gen_config_reference.env_name(KAIROSD_ENV, "kairos.beta"): "0.97",
        gen_config_reference.env_name(KAIROSD_ENV, "epoch_s"): "7",
        gen_config_reference.env_name(ROUTER_ENV, "placement.policy"): "round-robin",
    }
    kd = load_config(KairosdConfig, env_prefix=KAIROSD_ENV, env=env)
    assert kd.kairos.beta == 0.97 and kd.epoch_s == 7.0
    rc = load_config(RouterConfig, env_prefix=ROUTER_ENV, env=env)
    assert rc.placement.policy == "round-robin"


def test_the_operator_configuration_is_short() -> None:
    """The configuration states intents, addresses, credentials, limits and operational timeouts;
    the law's constants are its stages' (docs/notes/configuration.md). At most half
    of the 148 keys the three programs had before."""
    keys = sum(len(config_reference(cls)) for cls, _ in SCHEMAS.values())
    assert keys <= 74, keys
