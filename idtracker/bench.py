"""Overhead of id-tracker, side by side with running the agent directly.

    python -m idtracker.bench [--runs N]

Prints a table: wall time to launch and finish a trivial agent directly and
through id-tracker (against the loopback stand-in router), the CPU time
id-tracker itself uses while a 1 s CPU-bound agent runs, and the import cost of
the HTTP stack id-tracker avoids. Nothing here asserts a speed: the numbers are
for people (the team's rule: speed targets live in benchmarks, not tests).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from idtracker.testing import StandInRouter

_CPU_AGENT = r"""
import os, time
def ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
parent = os.getppid()
before = ticks(parent)
end = time.monotonic() + 1.0
while time.monotonic() < end:
    pass
print(ticks(parent) - before)
"""


def _wall_s(cmd: list[str], env: dict[str, str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _import_s(module: str, runs: int) -> float:
    cmd = [sys.executable, "-X", "importtime", "-c", f"import {module}"]
    samples = []
    for _ in range(runs):
        err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
        last = [ln for ln in err.splitlines() if ln.rstrip().endswith(f"| {module}")]
        samples.append(int(last[-1].split("|")[1]) / 1e6 if last else float("nan"))
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    runs = parser.parse_args().runs
    env = dict(os.environ, OPENAI_API_KEY="sk-bench")
    tracker = [sys.executable, "-m", "idtracker"]
    rows: list[tuple[str, float, float]] = []
    with StandInRouter() as router:
        wrap = [*tracker, "--router-url", router.url, "--"]
        for label, agent in (
            ("launch+exit `true`", ["true"]),
            ("launch+exit `python -c pass`", [sys.executable, "-c", "pass"]),
        ):
            rows.append((label, _wall_s(agent, env, runs), _wall_s(wrap + agent, env, runs)))
        cpu = subprocess.run(
            [*wrap, sys.executable, "-c", _CPU_AGENT], env=env, capture_output=True, text=True
        )
        direct_cpu = subprocess.run(
            [sys.executable, "-c", _CPU_AGENT], env=env, capture_output=True, text=True
        )
    hz = os.sysconf("SC_CLK_TCK")
    print(f"{'measure':44} {'direct':>10} {'id-tracker':>11} {'ratio':>7}")
    for label, base, wrapped in rows:
        print(f"{label:44} {base * 1e3:8.1f}ms {wrapped * 1e3:9.1f}ms {wrapped / base:6.1f}x")
    parent_ticks = int(direct_cpu.stdout.strip() or -1)
    tracker_ticks = int(cpu.stdout.strip() or -1)
    print(
        f"{'parent CPU while a 1 s agent runs':44} {parent_ticks * 1e3 / hz:8.1f}ms "
        f"{tracker_ticks * 1e3 / hz:9.1f}ms {'':>7}"
    )
    print(
        f"{'import http.client vs aiohttp (cumulative)':44} "
        f"{_import_s('http.client', runs) * 1e3:8.1f}ms {_import_s('aiohttp', runs) * 1e3:9.1f}ms"
    )
    print(f"(median of {runs} runs; direct parent = the shell-less benchmark process)")


if __name__ == "__main__":
    main()
