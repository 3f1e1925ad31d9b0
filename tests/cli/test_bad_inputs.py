"""Every subcommand of the four programs against a table of bad inputs.

Each case must end with the documented exit code and exactly one line on
stderr that names the program — no traceback, no usage box, nothing on stdout.
The programs run in-process through their real entry points (``main(argv)``,
the same function the console scripts call), except id-tracker, which blocks
signals for its whole process and so runs as a child process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer.main

from idtracker.cli import app as idtracker_app
from kairos_cli.main import build_app
from kairos_cli.main import main as kairos_main
from kairosd.cli import app as kairosd_app
from kairosd.cli import main as kairosd_main
from reporting.records import EpochRecord
from router.cli import app as router_app
from router.cli import main as router_main

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\x00"
_SAMPLE = {"float": 1.0, "int": 1, "str": "x", "bool": False}


def _epoch_line(**bad: object) -> str:
    """A complete epoch record with every field filled, then ``bad`` values put in."""
    obj: dict[str, object] = {"kind": "epoch"}
    for f in dataclasses.fields(EpochRecord):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            obj[f.name] = _SAMPLE.get(str(f.type).split(" |")[0])
    return json.dumps({**obj, **bad})


@dataclass(frozen=True)
class Case:
    program: str
    args: tuple[str, ...]
    code: int
    needle: str  # a piece of the one line that says what was wrong
    env: tuple[tuple[str, str], ...] = ()


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    """A loopback port some other socket is listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("bad")
    (d / "image.png").write_bytes(PNG)
    (d / "typo.toml").write_text('polcy = "kairos"\n')
    (d / "not.toml").write_text("this is = = not toml\n")
    (d / "short.jsonl").write_text('{"kind":"epoch","t_s":1}\n')
    (d / "typed.jsonl").write_text(_epoch_line(t_s="late") + "\n")
    (d / "notjson.jsonl").write_text("hello\n")
    (d / "empty.jsonl").write_text("")
    (d / "afile").write_text("x")
    (d / "nojsonl").mkdir()
    return {
        "png": str(d / "image.png"),
        "typo": str(d / "typo.toml"),
        "nottoml": str(d / "not.toml"),
        "short": str(d / "short.jsonl"),
        "typed": str(d / "typed.jsonl"),
        "notjson": str(d / "notjson.jsonl"),
        "empty": str(d / "empty.jsonl"),
        "file": str(d / "afile"),
        "dir": str(d / "nojsonl"),
        "missing": str(d / "missing.toml"),
        "nodir": str(d / "no" / "such" / "dir" / "port"),
    }


U = "http://127.0.0.1:9"  # a well-formed URL nobody needs to answer
RUN = ("run", "--instance", "i0", "--vllm-url", U)
ROUTER = ("run", "--backend", U, "--state-dir", "{tmp}/state")
SIM = ("sim", "--duration-s", "60", "--no-plots", "--out", "{tmp}/sim")


P = "h100-nvl-qwen3-30b"


def cases() -> list[Case]:
    c = Case
    return [
        # kairosd
        c("kairosd", (), 2, "missing a command"),
        c("kairosd", ("warp",), 2, "No such command"),
        c("kairosd", (*RUN, "--epoch-s", "-1"), 2, "epoch_s"),
        c("kairosd", (*RUN, "--epoch-s", "abc"), 2, "--epoch-s"),
        c("kairosd", (*RUN, "--slo", "0"), 2, "--slo"),
        c("kairosd", (*RUN, "--gpus", "a,b"), 2, "--gpus"),
        c("kairosd", (*RUN, "--policy", "warp"), 2, "policy 'warp'"),
        c("kairosd", (*RUN, "--policy", "fixed:x"), 2, "fixed:MHZ"),
        c("kairosd", (*RUN, "--gpu-backend", "nope"), 2, "gpu_backend"),
        c("kairosd", (*RUN, "--listen-port", "70000"), 2, "listen_port"),
        c("kairosd", (*RUN, "--listen-port", "{busy}"), 2, "already in use"),
        c("kairosd", (*RUN, "--log-level", "loud"), 2, "--log-level"),
        c("kairosd", ("run", "--instance", "i0", "--vllm-url", "notaurl"), 2, "vllm_url"),
        c("kairosd", (*RUN, "--router-url", "notaurl"), 2, "router_url"),
        c("kairosd", (*RUN, "--router-url", "http://127.0.0.1:99999"), 2, "port"),
        c("kairosd", ("run", "--vllm-url", U), 2, "--instance"),
        c("kairosd", (*RUN, "--config", "{missing}"), 2, "does not exist"),
        c("kairosd", (*RUN, "--config", "{png}"), 2, "binary"),
        c("kairosd", (*RUN, "--config", "{dir}"), 2, "directory"),
        c("kairosd", (*RUN, "--config", "{typo}"), 2, "did you mean policy"),
        c("kairosd", (*RUN, "--config", "{nottoml}"), 2, "not valid TOML"),
        c("kairosd", RUN, 2, "KAIROSD_POLCY", (("KAIROSD_POLCY", "kairos"),)),
        c("kairosd", (*RUN, "--bogus"), 2, "--bogus"),
        c("kairosd", (*RUN, "--report", "{dir}"), 2, "--report"),
        c("kairosd", ("gpus", "--gpu-backend", "nope"), 2, "--gpu-backend"),
        c("kairosd", ("gpus", "--gpu-backend", "sim", "--vllm-url", "notaurl"), 2, "--vllm-url"),
        c("kairosd", ("gpus", "--gpu-backend", "sim", "--vllm-url", U), 4, "kairosd:"),
        c("kairosd", ("gpus", "--config", "{missing}"), 2, "does not exist"),
        c("kairosd", ("gpus", "--log-level", "loud"), 2, "--log-level"),
        c("kairosd", ("reset", "--gpu-backend", "nope"), 2, "--gpu-backend"),
        c("kairosd", ("reset", "--gpus", "-1"), 2, "--gpus"),
        c("kairosd", ("reset", "--gpu", "x"), 2, "--gpu"),
        c("kairosd", ("reset", "--config", "{png}"), 2, "binary"),
        # kairos-router
        c("kairos-router", (), 2, "missing a command"),
        c("kairos-router", ("run",), 2, "no backend"),
        c("kairos-router", ("run", "--backend", "notaurl"), 2, "backend 'notaurl'"),
        c("kairos-router", ("run", "--backend", "http://127.0.0.1:99999"), 2, "port"),
        c("kairos-router", (*ROUTER, "--port", "70000"), 2, "port 70000"),
        c("kairos-router", (*ROUTER, "--port", "{busy}"), 2, "already in use"),
        c("kairos-router", (*ROUTER, "--placement", "random"), 2, "placement"),
        c("kairos-router", (*ROUTER, "--anonymous", "who"), 2, "anonymous"),
        c("kairos-router", (*ROUTER, "--idle-expiry-s", "-1"), 2, "idle_expiry_s"),
        c("kairos-router", (*ROUTER, "--log-level", "loud"), 2, "--log-level"),
        c("kairos-router", (*ROUTER, "--config", "{missing}"), 2, "does not exist"),
        c("kairos-router", (*ROUTER, "--config", "{png}"), 2, "binary"),
        c("kairos-router", ("run", "--backend", U, "--state-dir", "{file}"), 2, "cannot use"),
        c("kairos-router", (*ROUTER, "--records", "{dir}"), 2, "cannot use"),
        c("kairos-router", ("daemon-token", "i0", "--credentials-dir", "{dir}"), 2, "daemon.key"),
        # id-tracker (documented: 78 bad configuration, 69 router unreachable)
        c("id-tracker", (), 2, "Missing argument"),
        c("id-tracker", ("--slo", "-1", "--", "true"), 78, "--slo"),
        c("id-tracker", ("--router-url", "notaurl", "--", "true"), 78, "router URL"),
        c("id-tracker", ("--router-url", "http://127.0.0.1:99999", "--", "true"), 78, "Port"),
        c("id-tracker", ("--config", "{png}", "--", "true"), 78, "binary"),
        c("id-tracker", ("--config", "{missing}", "--", "true"), 78, "does not exist"),
        c(
            "id-tracker",
            ("--start-timeout-s", "0.2", "--router-url", U, "--", "true"),
            69,
            "id-tracker",
        ),
        c("id-tracker", ("--bogus", "--", "true"), 2, "--bogus"),
        c("id-tracker", ("--log-level", "loud", "--", "true"), 78, "--log-level"),
        # kairos
        c("kairos", (), 2, "missing a command"),
        c("kairos", ("sim", "--epoch-s", "-1"), 2, "--epoch-s"),
        c("kairos", (*SIM, "--epoch-s", "0"), 2, "--epoch-s"),
        c("kairos", (*SIM, "--seed", "-3"), 2, "--seed"),
        c("kairos", (*SIM, "--slo", "0"), 2, "--slo"),
        c("kairos", (*SIM, "--rate", "0"), 2, "--rate"),
        c("kairos", (*SIM, "--rate", "fast"), 2, "--rate"),
        c("kairos", (*SIM, "--instances", "0"), 2, "--instances"),
        c("kairos", (*SIM, "--policy", "fixed:5"), 2, "MHz"),
        c("kairos", (*SIM, "--policy", "fixed:99999"), 2, "MHz"),
        c("kairos", (*SIM, "--policy", "warp"), 2, "unknown policy"),
        c("kairos", (*SIM, "--preset", "nope"), 2, "unknown preset"),
        c("kairos", (*SIM, "--placement", "random"), 2, "placement"),
        c("kairos", (*SIM, "--processes", "-1"), 2, "--processes"),
        c("kairos", ("sim", "--out", "{file}"), 2, "not a directory"),
        c("kairos", (*SIM, "--arrivals", "{missing}"), 2, "--arrivals"),
        c("kairos", (*SIM, "--config", "{png}"), 2, "binary"),
        c("kairos", (*SIM, "--workload", "trace:{missing}"), 2, "cannot read trace"),
        c("kairos", (*SIM, "--log-level", "loud"), 2, "--log-level"),
        c("kairos", ("report",), 2, "Missing argument"),
        c("kairos", ("report", "{missing}"), 2, "cannot read"),
        c("kairos", ("report", "{png}"), 2, "binary"),
        c("kairos", ("report", "{dir}"), 2, "no *.jsonl"),
        c("kairos", ("report", "{short}"), 2, ":1: epoch record: missing field(s)"),
        c("kairos", ("report", "{typed}"), 2, ":1: epoch record: bad value"),
        c("kairos", ("report", "{notjson}"), 2, ":1: not JSON"),
        c("kairos", ("report", "{empty}"), 2, "no records"),
        c("kairos", ("report", "{short}", "--slo", "-1"), 2, "--slo"),
        c("kairos", ("report", "{short}", "--plots", "{file}"), 2, "--plots"),
        c("kairos", ("report", "{short}", "--plots", "{png}/x"), 2, "--plots"),
        c("kairos", ("fake-vllm", "--preset", "nope"), 2, "unknown preset"),
        c("kairos", ("fake-vllm", "--speedup", "0"), 2, "--speedup"),
        c("kairos", ("fake-vllm", "--port", "70000"), 2, "--port"),
        c("kairos", ("fake-vllm", "--port", "{busy}"), 2, "already in use"),
        c("kairos", ("fake-vllm", "--port-file", "{nodir}"), 2, "--port-file"),
        c("kairos", ("fake-vllm", "--kv-capacity-tokens", "0"), 2, "--kv-capacity-tokens"),
        c("kairos", ("calibrate",), 2, "--vllm-url"),
        c("kairos", ("calibrate", "--vllm-url", "notaurl"), 2, "--vllm-url"),
        c("kairos", ("calibrate", "--vllm-url", U, "--budget-s", "1"), 2, "--budget-s"),
        c("kairos", ("calibrate", "--vllm-url", U, "--base-preset", "nope"), 2, "--base-preset"),
        c("kairos", ("calibrate", "--vllm-url", U, "--out", "{dir}"), 2, "is a directory"),
        c("kairos", ("calibrate", "--vllm-url", U, "--max-num-seqs", "0"), 2, "--max-num-seqs"),
        c("kairos", ("calibrate", "--vllm-url", U), 1, "failed"),
        c("kairos", ("whatif",), 2, "--trace"),
        c("kairos", ("whatif", "--trace", "{missing}", "--preset", P), 2, "no such file"),
        c("kairos", ("whatif", "--trace", "{short}", "--preset", P), 2, "session_id"),
        c("kairos", ("whatif", "--trace", "{short}", "--preset", "{png}"), 2, "not TOML"),
        c("kairos", ("whatif", "--trace", "{short}", "--preset", "nope"), 2, "unknown preset"),
        c("kairos-router", (*ROUTER, "--trace-file", "{dir}"), 2, "is a directory"),
    ]


MAINS: dict[str, Callable[[list[str]], None]] = {
    "kairosd": kairosd_main,
    "kairos-router": router_main,
    "kairos": kairos_main,
}


def _args(case: Case, files: dict[str, str], busy: int, tmp: Path) -> list[str]:
    subs = {**files, "busy": str(busy), "tmp": str(tmp)}
    return [a.format(**subs) if "{" in a else a for a in case.args]


def _run(
    case: Case, argv: list[str], capsys: pytest.CaptureFixture[str], mp: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    for key, value in case.env:
        mp.setenv(key, value)
    if case.program == "id-tracker":
        env = {**os.environ, **dict(case.env), "KAIROS_IDTRACKER_CONFIG": "/nonexistent-ok"}
        env.pop("KAIROS_IDTRACKER_CONFIG")
        proc = subprocess.run(
            [sys.executable, "-m", "idtracker", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        return proc.returncode, proc.stdout, proc.stderr
    with pytest.raises(SystemExit) as info:
        MAINS[case.program](argv)
    out = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), out.out, out.err


@pytest.mark.parametrize("case", cases(), ids=lambda c: f"{c.program} {' '.join(c.args)}"[:70])
def test_bad_input_gets_one_clear_line(
    case: Case,
    files: dict[str, str],
    busy_port: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(case, _args(case, files, busy_port, tmp_path), capsys, monkeypatch)
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    assert code == case.code, (code, err)
    assert case.program.split()[0] in lines[0], lines[0]
    assert case.needle in lines[0], lines[0]
    assert out == "", out


def _subcommands(program: str) -> set[tuple[str, ...]]:
    apps = {
        "kairosd": kairosd_app,
        "kairos-router": router_app,
        "id-tracker": idtracker_app,
        "kairos": build_app(),
    }
    cmd = typer.main.get_command(apps[program])
    names = getattr(cmd, "commands", None)
    return {(program, n) for n in names} if names else {(program,)}


def test_the_table_covers_every_subcommand() -> None:
    covered = {(c.program, *c.args[:1]) for c in cases()} | {(c.program,) for c in cases()}
    every = set().union(*(_subcommands(p) for p in MAINS)) | _subcommands("id-tracker")
    assert every <= covered, sorted(every - covered)
