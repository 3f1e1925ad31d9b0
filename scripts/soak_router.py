"""Soak: many concurrent streaming agents through ``kairos-router run`` (loopback only).

    python -m scripts.soak_router --streams 1000 --duration-s 30 --stream-s 10

A slow fake backend (its own process) answers each streaming chat request with
one SSE event every ``--stream-s / 20`` seconds, 20 events in all. The router
runs as its own process; this process keeps ``--streams`` streams open at once,
each stream followed at once by the next, for ``--duration-s``. Reported:
requests, errors (non-200, an error event, or a failed connection), router RSS
at rest and at load (MiB per 1,000 open streams), the client-side time to first
event p50/p99 through the router, and the router's own added latency p99
(``kairos_router_overhead_seconds``, arrival → upstream send, bucket bound).
Bounded: the run ends after ``--duration-s`` + one stream, whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

SCRIPT = str(Path(__file__).resolve())
ROOT = Path(SCRIPT).parents[1]
HEADERS = {"Content-Type": "application/json"}
EVENTS = 20


async def _role_backend(stream_s: float) -> None:
    gap = stream_s / EVENTS

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m",
                 "choices": [{"index": 0, "delta": {"content": "tok "}}]}  # fmt: skip
        for _ in range(EVENTS):
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(gap)
        usage = {"prompt_tokens": 50, "completion_tokens": EVENTS, "total_tokens": 50 + EVENTS}
        last = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [],
                "usage": usage}  # fmt: skip
        await resp.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    async def ok(_r: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", ok)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    print(f"ready http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _overhead_p99(metrics_text: str) -> float | None:
    """The bucket bound under which 99% of the router's overhead observations fall."""
    buckets: dict[float, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith("kairos_router_overhead_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    if not buckets:
        return None
    total = buckets[max(buckets)]
    for bound in sorted(buckets):
        if total and buckets[bound] >= 0.99 * total:
            return bound
    return None


async def _spawn(
    args: list[str], marker: str, events: dict[str, int] | None = None
) -> tuple[asyncio.subprocess.Process, str]:
    events = {} if events is None else events
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=str(ROOT),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(60):
            while line := await proc.stdout.readline():
                text = line.decode(errors="replace")
                if marker == "ready" and text.startswith("ready "):
                    url = text.split()[1]
                    break
                if marker == "listening" and '"listening"' in text:
                    url = f"http://127.0.0.1:{json.loads(text)['port']}"
                    break
            else:
                raise RuntimeError(f"{args} exited during start-up")
    except BaseException:  # never leave a half-started child behind
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    asyncio.get_running_loop().create_task(_drain(proc.stdout, events))
    return proc, url


async def _drain(stream: asyncio.StreamReader, events: dict[str, int]) -> None:
    """Keep the child's pipe flowing; count its warning/error log events by name."""
    while line := await stream.readline():
        if b'"warning"' in line or b'"error"' in line:
            try:
                name = str(json.loads(line).get("event"))
            except ValueError:
                continue
            events[name] = events.get(name, 0) + 1


async def soak(streams: int, duration_s: float, stream_s: float) -> dict[str, object]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    script = SCRIPT
    procs: list[asyncio.subprocess.Process] = []
    try:
        backend, backend_url = await _spawn([script, "--role-backend", str(stream_s)], "ready")
        procs.append(backend)
        state = tempfile.mkdtemp(prefix="kairos-soak-")
        router_events: dict[str, int] = {}
        router, url = await _spawn(
            ["-m", "router.cli", "run", "--backend", backend_url, "--port", "0",
             "--state-dir", state, "--log-json", "--log-level", "info",
             "--capacity-tokens", "1000000000"],
            "listening",
            router_events,
        )  # fmt: skip
        procs.append(router)
        rss_rest = _rss_mib(router.pid)
        body = json.dumps({"model": "m", "stream": True,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip
        ttfe: list[float] = []
        errors: dict[str, int] = {}
        done = 0
        peak_rss = rss_rest
        deadline = time.monotonic() + duration_s
        conn = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=stream_s * 3 + 30)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:

            async def one() -> None:
                nonlocal done
                t0 = time.monotonic()
                first: float | None = None
                try:
                    async with s.post(
                        url + "/v1/chat/completions", data=body, headers=HEADERS
                    ) as r:
                        if r.status != 200:
                            errors[f"http_{r.status}"] = errors.get(f"http_{r.status}", 0) + 1
                            return
                        data = b""
                        async for chunk in r.content.iter_any():
                            if first is None:
                                first = time.monotonic() - t0
                            data += chunk
                        if b'"error"' in data or b"[DONE]" not in data:
                            errors["stream_error"] = errors.get("stream_error", 0) + 1
                            return
                except (aiohttp.ClientError, TimeoutError) as exc:
                    name = type(exc).__name__
                    errors[name] = errors.get(name, 0) + 1
                    return
                done += 1
                if first is not None:
                    ttfe.append(first)

            async def worker(i: int) -> None:
                await asyncio.sleep(stream_s * i / streams)  # ramp over one stream length
                while time.monotonic() < deadline:
                    await one()

            async def sampler() -> None:
                nonlocal peak_rss
                while time.monotonic() < deadline:
                    peak_rss = max(peak_rss, _rss_mib(router.pid))
                    await asyncio.sleep(1.0)

            await asyncio.gather(sampler(), *(worker(i) for i in range(streams)))
            async with s.get(url + "/metrics") as r:
                p99_overhead = _overhead_p99(await r.text())
        ttfe.sort()
        return {
            "streams": streams,
            "duration_s": duration_s,
            "stream_s": stream_s,
            "requests_ok": done,
            "errors": errors,
            "router_warnings": router_events,
            "router_rss_rest_mib": round(rss_rest, 1),
            "router_rss_peak_mib": round(peak_rss, 1),
            "rss_mib_per_1000_streams": round((peak_rss - rss_rest) / streams * 1000, 1),
            "ttfe_p50_s": round(statistics.median(ttfe), 4) if ttfe else None,
            "ttfe_p99_s": round(ttfe[int(0.99 * (len(ttfe) - 1))], 4) if ttfe else None,
            "router_overhead_p99_s_bucket": p99_overhead,
            "nofile_soft_before": soft,
            "nofile_hard": hard,
        }
    finally:
        for p in procs:
            if p.returncode is None:
                p.terminate()
                try:
                    await asyncio.wait_for(p.wait(), 15)
                except TimeoutError:
                    p.kill()
                    await p.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--stream-s", type=float, default=10.0)
    parser.add_argument("--role-backend", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role_backend is not None:
        asyncio.run(_role_backend(args.role_backend))
        return 0
    out = asyncio.run(soak(args.streams, args.duration_s, args.stream_s))
    print(json.dumps(out, indent=2))
    return 0 if not out["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
