"""kairos-router on its Redis store side by side with its SQLite store, on the shared
router harness (docs/scale-out.md, "Cost"), and one router's capacity at its CPU limit.

Runs ``../shared/bench/router/bench.py`` (one fake vLLM backend; the router under
test pinned to CPU 0, backend and load generator to CPU 1) with three targets in
one run, alternating between rounds: ``direct``, ``kairos-sqlite`` (the default
store) and ``kairos-redis`` (``--store redis://…``, a ``redis-server`` this script
starts on a free port, pinned to CPU 1 with the backend). Both routers run with
``anonymous = "api-key"``, so each load worker's key is one persisted agent,
dirty after every request: the store's work is on the measured path (with the
harness's anonymous default every request would be a one-turn agent, which no
store ever sees).

It prints, and writes into ``docs/notes/scale-out-store-bench.md`` between the ``bench-store``
markers: added p50 at one client and req/s at 64 clients for JSON and
streaming, router CPU per request, the two bars (Redis's added p50 within 0.2 ms
of SQLite's; Redis's req/s at 64 clients ≥ 0.9× SQLite's, each compared within
a round), the requests/s one router sustains at 100 % of its core (10⁶ / CPU µs
per request at 64 clients), and what one write of N dirty agents costs the
router's process with either store (in-process, after the harness).

    .venv/bin/python scripts/bench_router_store.py --rounds 3        # ~5 minutes
    .venv/bin/python scripts/bench_router_store.py --rounds 1 --no-doc

Needs ``redis-server`` on PATH (``make test`` installs it where it can).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kairos_common.logs import configure_logging
from router.redis_store import RedisStore
from router.store import SqliteStore
from scripts.bench_router_sidebyside import cpu_us, fmt, write_doc
from simulator.stack import free_port

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "notes" / "scale-out-store-bench.md"
START, END = "<!-- bench-store:start -->", "<!-- bench-store:end -->"
KAIROS = (
    "env KAIROS_ROUTER_ANONYMOUS=api-key PYTHONPATH={root} {python} -m router.cli run "
    "--backend {{backend_url}} --host 127.0.0.1 --port {{port}} --state-dir {{workdir}}/state"
)
CELLS = (("false", 1), ("true", 1), ("false", 64), ("true", 64))
TARGETS = ("kairos-sqlite", "kairos-redis")
Rows = list[dict[str, Any]]


def rows_of(
    rows: list[dict[str, Any]], target: str, stream: str, conc: int
) -> list[dict[str, Any]]:
    return [r for r in rows if (r["target"], str(r["stream"]).lower(), r["concurrency"])
            == (target, stream, conc)]  # fmt: skip


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def value(
    rows: list[dict[str, Any]], target: str, stream: str, conc: int, key: str
) -> float | None:
    """The median over rounds of ``key`` (``cpu_us``: router CPU per request)."""
    found = rows_of(rows, target, stream, conc)
    if key == "cpu_us":
        return median([cpu_us(r) for r in found])
    return median([r.get(key) for r in found])


def per_round(results: Path) -> Rows:
    """One row per (round, target, cell) from the harness's results, with the added
    p50 against ``direct`` in the same round and cell."""
    raw = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    direct = {(r["round"], r["stream"], r["concurrency"]): r["lat_ms"]["p50"]
              for r in raw if r["target"] == "direct" and r.get("lat_ms")}  # fmt: skip
    rows = []
    for r in raw:
        if r["target"] == "direct" or not r.get("lat_ms"):
            continue
        base = direct.get((r["round"], r["stream"], r["concurrency"]))
        rows.append({
            "target": r["target"], "stream": r["stream"], "concurrency": r["concurrency"],
            "round": r["round"], "rps": r["rps"], "proxy_cpu_pct": r.get("proxy_cpu_pct"),
            "overhead_p50_ms": None if base is None else r["lat_ms"]["p50"] - base,
        })  # fmt: skip
    return rows


def paired(rows: Rows, stream: str, conc: int, key: str) -> float | None:
    """Median over rounds of Redis against SQLite measured in the same round (the
    difference of added p50, the ratio of req/s): rounds alternate the targets, so
    a pair shares the machine's load of the moment."""
    by_round: dict[int, dict[str, float]] = {}
    for target in TARGETS:
        for row in rows_of(rows, target, stream, conc):
            if row.get(key) is not None:
                by_round.setdefault(int(row.get("round", 0)), {})[target] = float(row[key])
    pairs = [v for v in by_round.values() if len(v) == 2]
    if conc == 1:
        return median([v["kairos-redis"] - v["kairos-sqlite"] for v in pairs])
    return median([v["kairos-redis"] / v["kairos-sqlite"] for v in pairs if v["kairos-sqlite"]])


def render(rows: list[dict[str, Any]], meta: dict[str, str], flush: list[str]) -> str:
    lines = [
        "| cell | SQLite store | Redis store | Redis vs SQLite, same round (median) |",
        "|---|---|---|---|",
    ]
    for stream, conc in CELLS:
        mode = "stream" if stream == "true" else "JSON"
        if conc == 1:
            key, label, spec = "overhead_p50_ms", f"added p50 ms, 1 client, {mode}", ".2f"
        else:
            key, label, spec = "rps", f"req/s, 64 clients, {mode}", ".0f"
        s, r = (value(rows, t, stream, conc, key) for t in TARGETS)
        pair = paired(rows, stream, conc, key)
        if pair is None:
            versus = "—"
        elif conc == 1:
            versus = f"{pair:+.2f} ms (bar: ≤ +0.20)"
        else:
            versus = f"{pair:.2f}× (bar: ≥ 0.90×)"
        lines.append(f"| {label} | {fmt(s, spec)} | {fmt(r, spec)} | {versus} |")
    for stream, conc in CELLS:
        mode = "stream" if stream == "true" else "JSON"
        s, r = (value(rows, t, stream, conc, "cpu_us") for t in TARGETS)
        lines.append(f"| CPU µs/req, {conc} client{'s' * (conc > 1)}, {mode} | "
                     f"{fmt(s, '.0f')} | {fmt(r, '.0f')} | |")  # fmt: skip
    for stream in ("false", "true"):
        mode = "stream" if stream == "true" else "JSON"
        s, r = (value(rows, t, stream, 64, "cpu_us") for t in TARGETS)
        cap = [None if v is None else 1e6 / v for v in (s, r)]
        lines.append(f"| req/s at 100 % of one core, {mode} | {fmt(cap[0], '.0f')} | "
                     f"{fmt(cap[1], '.0f')} | |")  # fmt: skip
    notes = "\n".join(f"{k}: {v}" for k, v in meta.items())
    tables = "\n".join(lines) + "\n\nWhat one write of the changes costs the router (CPU):\n\n"
    return f"{START}\n```\n{notes}\n```\n\n" + tables + "\n".join(flush) + f"\n{END}"


def start_redis(workdir: Path, cpu: int) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(workdir), "--loglevel", "warning"]  # fmt: skip
    if shutil.which("taskset"):
        argv = ["taskset", "-c", str(cpu), *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ping = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                              check=False)  # fmt: skip
        if ping.stdout.strip() == b"PONG":
            return proc, port
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


async def _flush_cost(store: Any, agents: int, flushes: int) -> float:
    """Router CPU µs one write of ``agents`` dirty agents costs (process CPU: the
    SQLite store's worker thread included; Redis's own work is not in it)."""
    from kairos_common.wire import AgentStart
    from router.config import RouterConfig
    from router.core import RouterCore

    core = RouterCore(RouterConfig(backends=("i0=http://127.0.0.1:9",)), secret=None,
                      store=store, records=None)  # fmt: skip
    if isinstance(store, RedisStore):
        await store.try_acquire("bench", "", 60_000)
    for _ in range(agents):
        core.agents.start(AgentStart(name="bench"))
    await core.persist()
    ids = list(core.ledger.agents)
    t0 = time.process_time()
    for _ in range(flushes):
        core.ledger.dirty.update(ids)
        await core.persist()
    spent = time.process_time() - t0
    await store.close()
    return spent / flushes * 1e6


def flush_costs(redis_port: int, workdir: Path) -> list[str]:
    """Table rows: CPU per write by dirty agents, SQLite and Redis stores."""
    configure_logging("warning", False)  # not one agent_started line per agent
    lines = ["| dirty agents per write | SQLite store, µs | Redis store, µs |", "|---|---|---|"]
    for n in (1, 64, 1000, 10_000):
        k = max(5, 2000 // n)
        sqlite = asyncio.run(_flush_cost(SqliteStore(workdir / f"flush-{n}.sqlite3"), n, k))
        redis = asyncio.run(
            _flush_cost(RedisStore(f"redis://127.0.0.1:{redis_port}/0", prefix=f"bench{n}"), n, k)
        )
        lines.append(f"| {n} | {sqlite:.0f} | {redis:.0f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--harness", type=Path, default=ROOT.parent / "shared" / "bench" / "router")
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--no-doc", action="store_true", help="print the table, leave docs alone")
    ap.add_argument("--concurrency", default="1,64", help="cells (a subset: more rounds of one)")
    ap.add_argument("--stream", default="false,true")
    args = ap.parse_args(argv)
    bench = args.harness / "bench.py"
    if not bench.exists():
        print(f"no harness at {bench}", file=sys.stderr)
        return 2
    if shutil.which("redis-server") is None:
        print("redis-server is not installed (apt-get install -y redis-server)", file=sys.stderr)
        return 2
    out = args.out_dir or Path(tempfile.mkdtemp(prefix="kairos-store-bench."))
    out.mkdir(parents=True, exist_ok=True)
    redis, port = start_redis(out, cpu=1)
    try:
        python = shlex.quote(str(ROOT / ".venv" / "bin" / "python"))
        base = KAIROS.format(root=shlex.quote(str(ROOT)), python=python)
        specs = ["direct", f"kairos-sqlite={base}",
                 f"kairos-redis={base} --store redis://127.0.0.1:{port}/0"]  # fmt: skip
        cmd = [sys.executable, str(bench)]
        for spec in specs:
            cmd += ["--target", spec]
        cmd += ["--concurrency", args.concurrency, "--stream", args.stream, "--duration",
                str(args.duration), "--rounds", str(args.rounds), "--out-dir", str(out),
                # free ports: other benchmarks may hold the harness's defaults
                "--backend-port", str(free_port()), "--proxy-port", str(free_port())]  # fmt: skip
        load_before = os.getloadavg()
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        done = subprocess.run(cmd, check=False, timeout=3600)
        load_after = os.getloadavg()
        flush = flush_costs(port, out)
    finally:
        redis.terminate()
        redis.wait(10)
    summary = json.loads((out / "summary.json").read_text())
    rounds = per_round(out / "results.jsonl")
    meta = {
        "command": "python scripts/bench_router_store.py "
        + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "run": f"{started}, {os.cpu_count()} CPUs, load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after; {args.rounds} round(s) x {args.duration:g} s per cell; "
        "medians over rounds",
        "failures": "; ".join(summary.get("failures") or []) or "none",
    }
    block = render(rounds, meta, flush)
    print(block)
    if not args.no_doc:
        write_doc(block, DOC, START, END)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
