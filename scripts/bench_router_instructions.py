"""Instructions the router executes per proxied request (valgrind), one client.

Timings on a shared 2-core machine swing 3x with other people's load, CPU time
included; the number of instructions a request costs does not. This runs
``kairos-router run`` (and with ``--before REF`` the router at another git ref)
under ``valgrind --tool=callgrind`` with instrumentation switched on only while
the shared harness's load generator sends ``-n`` requests, one at a time, to the
harness's fake backend (JSON, then streaming), and prints user-space instructions
per request. Kernel work (loopback sockets) is not counted. Needs valgrind
(``apt-get install valgrind``); takes about a minute per target.

    .venv/bin/python -m scripts.bench_router_instructions --before f918c0e
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from scripts.bench_router_sidebyside import ROOT, checkout

PING = json.dumps(
    {"model": "fake-model", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_ready(url: str, timeout_s: float = 300.0) -> None:
    request = urllib.request.Request(  # noqa: S310 (http://127.0.0.1 only)
        url + "/v1/chat/completions", data=PING,
        headers={"Content-Type": "application/json", "Authorization": "Bearer sk-agent-0"},
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:  # noqa: S310
                resp.read()
                return
        except OSError:
            time.sleep(0.25)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f}s")


# Health checks and vLLM /metrics polls run on timers, not per request: pushed out
# of the measured window so the count does not depend on how long the window took.
QUIET = {
    "KAIROS_ROUTER_TIMEOUTS__HEALTH_INTERVAL_S": "3600",
    "KAIROS_ROUTER_TIMEOUTS__METRICS_INTERVAL_S": "3600",
}


def measure(
    harness: Path, pythonpath: Path, n: int, workdir: Path, env: dict[str, str]
) -> dict[str, float]:
    """Instructions per request of one router, for JSON and streaming replies (run
    from ``workdir``: ``python -m`` puts the working directory before PYTHONPATH)."""
    py = str(ROOT / ".venv" / "bin" / "python")
    bport, rport = free_port(), free_port()
    out = workdir / "callgrind.out"
    backend = subprocess.Popen(
        [py, str(harness / "fake_backend.py"), "--port", str(bport)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    router = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
         py, "-m", "router.cli", "run", "--backend", f"http://127.0.0.1:{bport}",
         "--host", "127.0.0.1", "--port", str(rport), "--state-dir", str(workdir / "state")],
        env={**os.environ, **QUIET, **env, "PYTHONPATH": str(pythonpath)}, cwd=workdir,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    result: dict[str, float] = {}
    try:
        url = f"http://127.0.0.1:{rport}"
        wait_ready(url)
        for stream in ("false", "true"):
            load = [py, str(harness / "loadgen.py"), "--base-url", url, "-c", "1",
                    "--warmup", "0", "--stream", stream]  # fmt: skip
            subprocess.run([*load, "-n", "30"], capture_output=True, check=False, timeout=600)
            control = ["callgrind_control", str(router.pid)]
            subprocess.run([*control[:1], "-i", "on", *control[1:]], capture_output=True)
            done = subprocess.run([*load, "-n", str(n)], capture_output=True, text=True,
                                  check=False, timeout=600)  # fmt: skip
            subprocess.run([*control[:1], "-i", "off", *control[1:]], capture_output=True)
            subprocess.run([*control[:1], "-d", *control[1:]], capture_output=True)
            count = json.loads(done.stdout.strip().splitlines()[-1])["count"]
            time.sleep(1)
            dumps = sorted(workdir.glob("callgrind.out*"), key=os.path.getmtime)
            totals = re.search(r"^totals:\s+(\d+)", dumps[-1].read_text(), re.M)
            assert totals is not None
            result[stream] = int(totals.group(1)) / max(count, 1)
    finally:
        for proc in (router, backend):
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in (router, backend):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--harness", type=Path, default=ROOT.parent / "shared" / "bench" / "router")
    ap.add_argument("--before", default="", help="git ref to measure too")
    ap.add_argument("-n", type=int, default=200, help="measured requests per mode")
    args = ap.parse_args(argv)
    targets = [
        ("kairos", ROOT, {}),
        ("kairos, asyncio loop", ROOT, {"KAIROS_ROUTER_EVENT_LOOP": "asyncio"}),
    ]
    if args.before:
        targets.append((f"kairos@{args.before}", checkout(args.before), {}))
    rows = []
    for name, path, env in targets:
        with tempfile.TemporaryDirectory(prefix="kairos-instr.") as tmp:
            got = measure(args.harness, path, args.n, Path(tmp), env)
        rows.append(f"| {name} | {got['false'] / 1e6:.2f} M | {got['true'] / 1e6:.2f} M |")
    print("| router | instructions/request, JSON | instructions/request, stream |")
    print("|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
