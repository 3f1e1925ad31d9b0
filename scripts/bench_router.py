"""Router overhead benchmark (loopback only, bounded): direct vs plain proxy vs kairos-router.

Three targets serve the *same* fake backend process (``router.testing.FakeBackend``):

* ``direct``  — the client talks to the backend;
* ``proxy``   — a plain aiohttp pass-through proxy (read body, forward, stream back);
* ``router``  — ``kairos-router run`` (signed identities, ledger, placement, admission,
  usage injection/stripping, metrics — everything on).

Each runs in its own process; the load generator is this process. For every mode
(non-streaming, streaming) and every agent count (1, 64, 256):

* **latency phase** — N agents each loop request → think time (exponential, mean
  N / ``--rate``) → request, so the aggregate offered load is ``--rate`` req/s, as
  with agents that spend time in tools between turns. Reported: p50/p99 of request
  latency (send → last byte), and the router's *added* latency = router − direct.
* **throughput phase** — N agents in a closed loop without think time for
  ``--throughput-s`` seconds: max req/s, and the router/proxy ratio.

Usage::

    .venv/bin/python scripts/bench_router.py            # full table (~2 min)
    .venv/bin/python scripts/bench_router.py --quick    # smaller, for a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

SCRIPT = str(Path(__file__).resolve())
ROOT = Path(SCRIPT).parents[1]
sys.path.insert(0, str(ROOT))

from kairos_common.credentials import LIFECYCLE_FILE, discover_credential  # noqa: E402
from kairos_common.identity import compose_key  # noqa: E402
from router.testing import FakeBackend  # noqa: E402

MAX_BENCH_S = 600.0  # hard bound on the whole run


# -- child roles ---------------------------------------------------------------------------


async def _role_backend() -> None:
    fake = FakeBackend(record=False)
    fake.behaviour.completion_tokens = 16
    fake.behaviour.prompt_tokens = 200
    url = await fake.start()
    print(f"ready {url}", flush=True)
    await asyncio.Event().wait()


async def _role_proxy(upstream: str) -> None:
    """The baseline: the plainest correct aiohttp pass-through proxy."""
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
    hop = {"host", "content-length", "transfer-encoding", "connection", "date", "server"}

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        async with session.request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        ) as up:
            out_headers = {k: v for k, v in up.headers.items() if k.lower() not in hop}
            out = web.StreamResponse(status=up.status, headers=out_headers)
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(f"ready http://127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


# -- process management ----------------------------------------------------------------


async def _spawn(
    args: list[str], ready: Callable[[bytes], str | None]
) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=str(ROOT),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stream = proc.stdout if any(a.endswith("bench_router.py") for a in args) else proc.stderr
    assert stream is not None
    try:
        async with asyncio.timeout(30):
            while True:
                line = await stream.readline()
                if not line:
                    raise RuntimeError(f"{args} exited during start-up")
                url = ready(line)
                if url:
                    _DRAINS.append(asyncio.create_task(_drain(stream)))
                    return proc, url
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise


_DRAINS: list[asyncio.Task[None]] = []


async def _drain(stream: asyncio.StreamReader) -> None:
    """Keep reading a child's log so a full pipe never blocks it."""
    while await stream.readline():
        pass


def _ready_line(line: bytes) -> str | None:
    return line.decode().split()[1] if line.startswith(b"ready ") else None


def _router_ready(line: bytes) -> str | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if obj.get("event") == "listening":
        return f"http://127.0.0.1:{obj['port']}"
    return None


# -- load generation --------------------------------------------------------------------


def _body(stream: bool) -> bytes:
    msgs = [{"role": "system", "content": "You are a helpful agent."}]
    msgs.append({"role": "user", "content": "Fix the failing test in repo/x.py " * 8})
    return json.dumps({"model": "fake-model", "messages": msgs, "stream": stream}).encode()


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, key: str) -> float:
    t0 = time.perf_counter()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
        async for _ in r.content.iter_any():
            pass
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status} from {url}")
    return time.perf_counter() - t0


async def _latency_phase(
    url: str, keys: list[str], stream: bool, rate: float, samples: int, seed: int
) -> list[float]:
    body = _body(stream)
    n = len(keys)
    per_agent = max(1, samples // n)
    gap = n / rate
    out: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def agent(i: int) -> None:
            rng = random.Random(seed + i)
            await asyncio.sleep(rng.uniform(0, gap) if n > 1 else 0)  # spread start (load shape)
            for _ in range(per_agent):
                out.append(await _one(s, url, body, keys[i]))
                if n > 1:
                    await asyncio.sleep(rng.expovariate(1.0 / gap))  # tool time between turns

        await _one(s, url, body, keys[0])  # warm the connection pool
        await asyncio.gather(*(agent(i) for i in range(n)))
    return out


async def _throughput_phase(url: str, keys: list[str], stream: bool, seconds: float) -> float:
    body = _body(stream)
    done = 0
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def worker(i: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await _one(s, url, body, keys[i])
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(len(keys))))
        elapsed = time.perf_counter() - t0
    return done / elapsed


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- orchestration ------------------------------------------------------------------------


async def _agent_keys(router_url: str, n: int) -> list[str]:
    """Register ``n`` agents with the lifecycle credential, as id-tracker does."""
    token = discover_credential(router_url, LIFECYCLE_FILE)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s:
        keys = []
        for _ in range(n):
            async with s.post(router_url + "/kairos/v1/agents", json={}, headers=headers) as r:
                keys.append(compose_key((await r.json())["token"], "sk-bench"))
        return keys


def _cpu_s(pid: int) -> float:
    """User+system CPU seconds of a process (Linux /proc), to report CPU per request."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Samples:
    latencies_s: list[float] = field(default_factory=list)
    rps: list[float] = field(default_factory=list)
    cpu_us_per_req: list[float] = field(default_factory=list)


async def _cell(
    targets: dict[str, tuple[str, int]], keys: list[str], stream: bool, args: argparse.Namespace
) -> dict[str, Samples]:
    """Targets interleaved over ``--rounds`` rounds (rotating order), so machine noise
    hits all three alike; throughput is the median round, latencies are pooled."""
    out = {name: Samples() for name in targets}
    names = list(targets)
    per_round = max(1, args.samples // args.rounds)
    seconds = args.throughput_s / args.rounds
    for rnd in range(args.rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for name in order:
            url, _pid = targets[name]
            lat = await _latency_phase(url, keys, stream, args.rate, per_round, 7 + rnd)
            out[name].latencies_s.extend(lat)
        for name in order:
            url, pid = targets[name]
            c0 = _cpu_s(pid)
            rps = await _throughput_phase(url, keys, stream, seconds)
            out[name].rps.append(rps)
            out[name].cpu_us_per_req.append((_cpu_s(pid) - c0) / (rps * seconds) * 1e6)
    return out


async def _main(args: argparse.Namespace) -> None:
    script = SCRIPT
    procs: list[asyncio.subprocess.Process] = []
    try:
        backend, backend_url = await _spawn([script, "--role", "backend"], _ready_line)
        procs.append(backend)
        proxy, proxy_url = await _spawn([script, "--role", "proxy", backend_url], _ready_line)
        procs.append(proxy)
        state = tempfile.mkdtemp(prefix="kairos-bench-")
        router, router_url = await _spawn(
            ["-m", "router.cli", "run", "--backend", backend_url, "--port", "0",
             "--state-dir", state, "--log-json", "--log-level", "info"],
            _router_ready,
        )  # fmt: skip
        procs.append(router)
        targets = {
            "direct": (backend_url, backend.pid),
            "proxy": (proxy_url, proxy.pid),
            "router": (router_url, router.pid),
        }
        all_keys = await _agent_keys(router_url, max(args.agents))
        print(HEADER)
        print("|" + "---|" * 11)
        for stream in (False, True):
            for n in args.agents:
                _print_row(stream, n, await _cell(targets, all_keys[:n], stream, args))
    finally:
        for p in procs:
            if p.returncode is None:
                p.terminate()
                await p.wait()


HEADER = (
    "| mode | agents | direct p50/p99 ms | proxy p50/p99 ms | router p50/p99 ms "
    "| router added p50/p99 ms | direct req/s | proxy req/s | router req/s "
    "| router/proxy req/s | CPU µs/req proxy → router |"
)


def _print_row(stream: bool, n: int, cells: dict[str, Samples]) -> None:
    def pp(c: Samples) -> str:
        return f"{_pct(c.latencies_s, 0.5) * 1e3:.2f} / {_pct(c.latencies_s, 0.99) * 1e3:.2f}"

    d, p, r = cells["direct"], cells["proxy"], cells["router"]
    added50 = (_pct(r.latencies_s, 0.5) - _pct(d.latencies_s, 0.5)) * 1e3
    added99 = (_pct(r.latencies_s, 0.99) - _pct(d.latencies_s, 0.99)) * 1e3
    med = statistics.median
    print(
        f"| {'stream' if stream else 'json'} | {n} | {pp(d)} | {pp(p)} | {pp(r)} "
        f"| {added50:+.2f} / {added99:+.2f} | {med(d.rps):.0f} | {med(p.rps):.0f} "
        f"| {med(r.rps):.0f} | {med(r.rps) / med(p.rps):.2f} "
        f"| {med(p.cpu_us_per_req):.0f} → {med(r.cpu_us_per_req):.0f} |",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--role", choices=["backend", "proxy"], help=argparse.SUPPRESS)
    ap.add_argument("upstream", nargs="?", help=argparse.SUPPRESS)
    ap.add_argument("--agents", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--rate", type=float, default=200.0, help="offered req/s, latency phase")
    ap.add_argument("--samples", type=int, default=600, help="requests per latency cell")
    ap.add_argument("--throughput-s", type=float, default=2.0, help="seconds per req/s cell")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per cell")
    ap.add_argument("--quick", action="store_true", help="fewer samples, shorter cells")
    args = ap.parse_args()
    if args.role == "backend":
        asyncio.run(_role_backend())
        return
    if args.role == "proxy":
        asyncio.run(_role_proxy(args.upstream))
        return
    if args.quick:
        args.samples, args.throughput_s, args.rounds = 150, 1.0, 1

    async def bounded() -> None:
        async with asyncio.timeout(MAX_BENCH_S):
            await _main(args)

    asyncio.run(bounded())


if __name__ == "__main__":
    main()
