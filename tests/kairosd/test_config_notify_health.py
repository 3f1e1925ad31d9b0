from __future__ import annotations

import asyncio
import os
import re
import socket
import tempfile
from pathlib import Path

import aiohttp
import pytest

from controllers.frequency import FrequencyLevels
from controllers.policy import Intents
from controllers.predictive import PredictiveController
from controllers.registry import make_controller
from kairos_common.errors import ConfigError
from kairos_common.testing import ManualClock
from kairos_common.vllm_metrics import VllmMetrics
from kairosd.config import KairosdConfig, load_daemon_config
from kairosd.gpu.sim_backend import SimBackend
from kairosd.health_server import HealthServer
from kairosd.loop import Daemon
from kairosd.metrics import DaemonMetrics
from kairosd.sdnotify import Notifier
from kairosd.startup import build_controller
from kairosd.testing import ScriptedVllm
from tests.kairosd.conftest import CLOCKS, ListSink, make_daemon


def test_config_layers_toml_env_flags(tmp_path: Path) -> None:
    path = tmp_path / "gpu0.toml"
    path.write_text(
        'instance = "gpu0"\nvllm_url = "http://127.0.0.1:8000"\ngpus = [0, 1]\n'
        "epoch_s = 4.0\n[kairos]\nbeta = 0.97\n"
    )
    env = {"KAIROSD_EPOCH_S": "6", "KAIROSD_KAIROS__SLO_TOK_S": "35"}
    cfg = load_daemon_config(path, env=env, overrides={"policy": "no-control", "epoch_s": None})
    assert cfg.gpus == (0, 1) and cfg.epoch_s == 6.0 and cfg.policy == "no-control"
    assert cfg.kairos == Intents(slo_tok_s=35.0, beta=0.97)
    assert cfg.listen_host == "127.0.0.1" and cfg.standalone


@pytest.mark.parametrize(
    "overrides",
    [
        {"gpu_backend": "nvml"},
        {"epoch_s": 0.5, "http_timeout_s": 1.0},  # an explicit timeout must fit the epoch
        {"gpus": "-1"},
        {"typo_key": 1},
        {"kairos": {"beta": 0.5}},  # kairos's gamma 0.95 > beta
        {"kairos": {"slo_tok_s": -1.0}},
        {"policy": "kairos-paper"},  # renamed
        {"sim_speedup": 0.0},
        {"gpu_backend": "observe", "require_control": True},
    ],
)
def test_bad_config_is_rejected(overrides: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        load_daemon_config(None, env={}, overrides=overrides)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"kv_bytes_per_token": 0}, "kv_bytes_per_token 0: expected bytes per token in 1.."),
        ({"kv_bytes_per_token": -98304}, "kv_bytes_per_token -98304"),
        ({"kv_bytes_per_token": 2**30}, "kv_bytes_per_token 1073741824"),
        ({"kv_bytes_per_token": "98k"}, "kv_bytes_per_token: expected an integer"),
        ({"kv_offloading_gib": -1.0}, "kv_offloading_gib -1: expected GiB in 0.."),
        ({"kv_offloading_gib": "nan"}, "kv_offloading_gib nan"),
        ({"kv_offloading_gib": "inf"}, "kv_offloading_gib inf"),
        ({"kv_offloading_gib": 1e9}, "kv_offloading_gib 1e+09"),
    ],
)
def test_bad_kv_sizes_are_rejected(overrides: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_daemon_config(None, env={}, overrides=overrides)


def test_kv_sizes_from_toml_and_env(tmp_path: Path) -> None:
    path = tmp_path / "gpu0.toml"
    path.write_text("kv_bytes_per_token = 131072\nkv_offloading_gib = 0\n")
    cfg = load_daemon_config(path, env={"KAIROSD_KV_OFFLOADING_GIB": "192"})
    assert cfg.kv_bytes_per_token == 131072 and cfg.kv_offloading_gib == 192.0
    default = load_daemon_config(None, env={})
    assert default.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2 and default.kv_offloading_gib is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[kairos]\nalpha = 0.7\n", "kairos.alpha was removed: a constant of the law"),
        ("[kairos]\nbusy_ceiling = true\n", "kairos.busy_ceiling was removed: not adopted"),
        ("[kairos]\nmake_room = false\n", "kairos.make_room was removed: a departure measured"),
        ("[predictive]\nmargin = 0.2\n", "predictive was removed: the predictive policy's"),
        ("decision_valid_epochs = 2\n", "decision_valid_epochs was removed"),
    ],
)
def test_a_removed_key_says_what_replaced_it(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "gpu0.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_daemon_config(path, env={})


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"KAIROSD_KAIROS__IDLE_AFTER_S": "5"}, "__IDLE_AFTER_S: kairos.idle_after_s was removed"),
        ({"KAIROSD_PREDICTIVE__PERF__WARMUP": "5"}, "predictive was removed"),
    ],
)
def test_a_removed_variable_says_what_replaced_it(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_daemon_config(None, env=env)


async def test_the_operator_s_intents_reach_the_controller(
    tmp_path: Path, vllm: ScriptedVllm, session: aiohttp.ClientSession
) -> None:
    path = tmp_path / "gpu0.toml"
    path.write_text('policy = "predictive"\n[kairos]\nslo_tok_s = 30.0\ngamma = 0.9\n')
    cfg = load_daemon_config(path, env={"KAIROSD_KAIROS__BETA": "0.96"})
    ctrl = await build_controller(SimBackend(vllm.url, (0,), session), cfg)
    assert isinstance(ctrl, PredictiveController)
    assert ctrl.slo_tok_s == 30.0 and (ctrl.rule.beta, ctrl.rule.gamma) == (0.96, 0.9)


def test_router_token_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    cfg = KairosdConfig(router_token_file=token)
    assert cfg.resolved_router_token() == "s3cret"
    assert KairosdConfig(router_token="t").resolved_router_token() == "t"


def test_sd_notify_datagrams() -> None:
    sock_dir = tempfile.mkdtemp(prefix="kn", dir="/tmp")
    path = os.path.join(sock_dir, "n")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        n = Notifier(path)
        assert n.ready("epoch 0") and n.watchdog()
        assert sock.recv(256) == b"READY=1\nSTATUS=epoch 0"
        assert sock.recv(256) == b"WATCHDOG=1"
    os.unlink(path)
    os.rmdir(sock_dir)
    assert not Notifier(None).ready("x")
    assert not Notifier("/nonexistent/sock").watchdog()  # never fatal


async def test_health_and_metrics_endpoints(
    vllm: ScriptedVllm, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    daemon = await make_daemon(vllm, None, session, clock)
    vllm.vllm.kv_usage_frac = 0.3
    await daemon.run_epoch()
    server = HealthServer(daemon.metrics, daemon.health, "127.0.0.1", 0)
    port = await server.start()
    try:
        async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
            body = await resp.json()
            assert resp.status == 200 and body["mode"] == "standalone"
            assert body["controls_clocks"] and body["epoch"] == 1
        async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert "kairosd_usage_tokens" in await resp.text()
        clock.advance(60.0)  # no epoch for 12 periods: unhealthy
        async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
            assert resp.status == 503
    finally:
        await server.stop()


class SlowVllm:
    """An input source that takes longer than an epoch (beyond its own timeout)."""

    async def fetch(self) -> VllmMetrics:
        await asyncio.sleep(0.25)
        return VllmMetrics(metrics_enabled=True, capacity_tokens=1000, kv_usage_frac=0.1)


class StaticGpu:
    name = "static"
    controls = False

    async def status(self) -> list[object]:
        return []

    async def supported_clocks_mhz(self) -> tuple[int, ...]:
        return CLOCKS

    async def set_locked_clock(self, clock_mhz: int) -> None: ...
    async def reset_clocks(self) -> None: ...
    async def close(self) -> None: ...


async def test_missed_epochs_are_counted_and_stop_is_prompt() -> None:
    cfg = KairosdConfig(
        instance="g", vllm_url="http://x", epoch_s=0.1, http_timeout_s=0.05, gpu_timeout_s=0.05
    )
    daemon = Daemon(
        cfg,
        backend=StaticGpu(),  # type: ignore[arg-type]
        controller=make_controller("kairos", FrequencyLevels.from_supported(CLOCKS)),
        vllm=SlowVllm(),
        router=None,
        sink=ListSink(),
        metrics=DaemonMetrics("g"),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run_forever(stop))
    async with asyncio.timeout(5.0):
        await daemon.wait_epochs(2)
        stop.set()
        await task
    text = daemon.metrics.render().decode()
    missed = [ln for ln in text.splitlines() if ln.startswith("kairosd_missed_epochs_total")]
    assert missed and float(missed[0].split()[-1]) >= 2
