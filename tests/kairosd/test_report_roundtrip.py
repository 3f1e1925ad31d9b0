"""The daemon writes its power report; ``kairos report`` reads it."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from typer.testing import CliRunner

from kairos_cli.main import build_app
from kairos_common.testing import ManualClock
from kairosd.testing import FakeRouter, ScriptedVllm
from reporting.records import JsonlWriter
from tests.kairosd.conftest import agent, make_daemon


async def test_daemon_report_is_read_by_kairos_report(
    vllm: ScriptedVllm,
    router: FakeRouter,
    session: aiohttp.ClientSession,
    clock: ManualClock,
    tmp_path: Path,
) -> None:
    path = tmp_path / "gpu0.jsonl"
    daemon = await make_daemon(vllm, router, session, clock)
    writer = JsonlWriter(path)
    daemon.sink = writer
    for usage in (0, 0, 80_000, 80_000):
        router.ongoing = [agent("a", usage)]
        await daemon.run_epoch()
        clock.advance(5.0)
    await daemon.shutdown()
    writer.close()
    assert len(path.read_text().splitlines()) == 4

    result = CliRunner().invoke(build_app(), ["report", str(path), "--json"])
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert obj["policy"] == "kairos"
    # 10 s at 800 MHz (340 W) and 10 s at 1600 MHz (580 W) on the fake power model
    assert obj["energy_j"] == pytest.approx(10 * 340 + 10 * 580)
    assert obj["avg_power_w"] == pytest.approx((10 * 340 + 10 * 580) / 20)
    assert obj["time_at_clock_s"] == {"800": 10.0, "1600": 10.0}
