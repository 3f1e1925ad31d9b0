"""kairos-router side by side with the Rust vllm-router, on the shared harness.

Runs ``../shared/bench/router/bench.py`` (one fake vLLM backend, the router under
test pinned to CPU 0, backend and load generator on CPU 1; see its README) with
the targets ``direct``, ``vllm-router`` and ``kairos`` (this checkout's
``kairos-router run``, every feature on), and optionally ``kairos-before`` (the
same router at another git ref, for a before/after in one run), and with
``--floor`` ``aiohttp-floor`` (``scripts/bench_router_floor.py``: a bare aiohttp +
uvloop proxy, what any router on this HTTP stack costs at least). It then writes
the summary table into ``docs/notes/router-benchmarks.md`` between the ``bench-sidebyside``
markers, with the command, the date and the machine's load.

vllm-router comes from the package index into its own environment
(``.cache/vllm-router-venv``, made once); if pip cannot fetch it the run goes on
without it and the table says so.

    .venv/bin/python scripts/bench_router_sidebyside.py                 # ~2 minutes
    .venv/bin/python scripts/bench_router_sidebyside.py --before HEAD~3 --rounds 2
    .venv/bin/python scripts/bench_router_sidebyside.py --floor --rounds 3

All traffic stays on 127.0.0.1; every load cell is bounded by ``--duration``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "notes" / "router-benchmarks.md"
START, END = "<!-- bench-sidebyside:start -->", "<!-- bench-sidebyside:end -->"
VLLM_ROUTER = (
    "{bin}/vllm-router --host 127.0.0.1 --port {{port}} --worker-urls {{backend_url}} "
    "--policy round_robin --log-level warning --worker-startup-check-interval 1 "
    "--prometheus-host 127.0.0.1 --prometheus-port 18190"
)
KAIROS = (
    "{env}{python} -m router.cli run --backend {{backend_url}} --host 127.0.0.1 "
    "--port {{port}} --state-dir {{workdir}}/state"
)
FLOOR = "{python} {here}/bench_router_floor.py {{backend_url}} {{port}}"
CELLS = (("false", 1), ("true", 1), ("false", 64), ("true", 64))


def vllm_router_env(venv: Path) -> Path | None:
    """The environment with vllm-router (and the harness's needs), made once."""
    exe = venv / "bin" / "vllm-router"
    if exe.exists():
        return venv
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "--quiet"]
    done = subprocess.run([*pip, "aiohttp", "numpy", "uvloop", "vllm-router"], check=False)
    if done.returncode != 0 or not exe.exists():
        print("vllm-router could not be installed from the package index", file=sys.stderr)
        return None
    return venv


def checkout(ref: str) -> Path:
    """The router's packages at git ``ref``, unpacked under .cache (imported first)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    dest = ROOT / ".cache" / f"bench-before-{sha}"
    if not dest.exists():
        archive = subprocess.run(
            ["git", "archive", sha, "router", "kairos_common", "reporting", "controllers"],
            cwd=ROOT, check=True, capture_output=True,
        ).stdout  # fmt: skip
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
    return dest


def cell(rows: list[dict[str, Any]], target: str, stream: str, conc: int) -> dict[str, Any]:
    for row in rows:
        same = (row["target"], str(row["stream"]).lower(), row["concurrency"])
        if same == (target, stream, conc):
            return row
    return {}


def cpu_us(row: dict[str, Any]) -> float | None:
    """Router CPU per request: the harness's CPU% over its req/s (its CPU% window
    includes the load generator's start-up, so this reads ~10% low, alike for all)."""
    if not row.get("rps") or row.get("proxy_cpu_pct") is None:
        return None
    return float(row["proxy_cpu_pct"]) / 100.0 / float(row["rps"]) * 1e6


def fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def render(rows: list[dict[str, Any]], targets: list[str], meta: dict[str, str]) -> str:
    head = "| cell | " + " | ".join(targets) + " |"
    lines = [head, "|---|" + "---|" * len(targets)]
    for stream, conc in CELLS:
        mode = "stream" if stream == "true" else "JSON"
        if conc == 1:
            label = f"added p50 ms, 1 client, {mode}"
            vals = [fmt(cell(rows, t, stream, 1).get("overhead_p50_ms"), ".2f") for t in targets]
        else:
            label = f"req/s, {conc} clients, {mode}"
            vals = [fmt(cell(rows, t, stream, conc).get("rps"), ".0f") for t in targets]
        lines.append(f"| {label} | " + " | ".join(vals) + " |")
    for stream, conc in CELLS:
        mode = "stream" if stream == "true" else "JSON"
        vals = [fmt(cpu_us(cell(rows, t, stream, conc)), ".0f") for t in targets]
        lines.append(
            f"| CPU µs/req, {conc} client{'s' * (conc > 1)}, {mode} | " + " | ".join(vals) + " |"
        )
    notes = "\n".join(f"{k}: {v}" for k, v in meta.items())
    return f"{START}\n```\n{notes}\n```\n\n" + "\n".join(lines) + f"\n{END}"


def write_doc(block: str, doc: Path = DOC, start: str = START, end: str = END) -> None:
    """Put ``block`` between the ``start`` and ``end`` markers of ``doc`` (appended
    when the markers are not there yet)."""
    text = doc.read_text()
    if start in text and end in text:
        before, rest = text.split(start, 1)
        text = before + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--harness", type=Path, default=ROOT.parent / "shared" / "bench" / "router")
    ap.add_argument("--vllm-router-venv", type=Path, default=ROOT / ".cache" / "vllm-router-venv")
    ap.add_argument("--before", default="", help="git ref to run as kairos-before (same run)")
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also run aiohttp-floor: a bare aiohttp + uvloop proxy (any aiohttp router's floor)",
    )
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--no-doc", action="store_true", help="print the table, leave docs alone")
    args = ap.parse_args(argv)
    bench = args.harness / "bench.py"
    if not bench.exists():
        print(f"no harness at {bench}", file=sys.stderr)
        return 2
    python = shlex.quote(str(ROOT / ".venv" / "bin" / "python"))
    targets = ["direct"]
    specs = ["direct"]
    venv = vllm_router_env(args.vllm_router_venv)
    if venv is not None:
        targets.append("vllm-router")
        specs.append("vllm-router=" + VLLM_ROUTER.format(bin=shlex.quote(str(venv / "bin"))))
    here = f"PYTHONPATH={shlex.quote(str(ROOT))} "
    targets.append("kairos")
    specs.append("kairos=" + KAIROS.format(env=here, python=python))
    if args.before:
        old = checkout(args.before)
        targets.append("kairos-before")
        specs.append(
            "kairos-before="
            + KAIROS.format(env=f"PYTHONPATH={shlex.quote(str(old))} ", python=python)
        )
    if args.floor:
        targets.append("aiohttp-floor")
        here_dir = shlex.quote(str(ROOT / "scripts"))
        specs.append("aiohttp-floor=" + FLOOR.format(python=python, here=here_dir))
    out = args.out_dir or Path(tempfile.mkdtemp(prefix="kairos-sidebyside."))
    harness_python = str((venv or Path(sys.prefix)) / "bin" / "python")
    cmd = [harness_python, str(bench)]
    for spec in specs:
        cmd += ["--target", spec]
    cmd += ["--concurrency", "1,64", "--stream", "false,true", "--duration", str(args.duration),
            "--rounds", str(args.rounds), "--out-dir", str(out)]  # fmt: skip
    load_before = os.getloadavg()
    env = dict(os.environ, PATH=f"{Path(harness_python).parent}:{os.environ.get('PATH', '')}")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    done = subprocess.run(cmd, env=env, check=False, timeout=3600)
    load_after = os.getloadavg()
    summary = json.loads((out / "summary.json").read_text())
    shown = [t for t in targets if t != "direct"]
    meta = {
        "command": "python scripts/bench_router_sidebyside.py "
        + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "run": f"{started}, {os.cpu_count()} CPUs, load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after; {args.rounds} round(s) x {args.duration:g} s per cell",
        "vllm-router": "installed"
        if venv is not None
        else "NOT installed (pip could not fetch it)",
        "failures": "; ".join(summary.get("failures") or []) or "none",
    }
    if args.before:
        meta["kairos-before"] = f"git {args.before}"
    block = render(summary["rows"], shown, meta)
    print(block)
    if not args.no_doc:
        write_doc(block)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
