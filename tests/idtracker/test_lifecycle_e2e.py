"""id-tracker as a real process in front of real agents, against the stand-in router."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from idtracker.errors import EXIT_REJECTED, EXIT_ROUTER_UNAVAILABLE
from idtracker.testing import StandInRouter
from kairos_common.identity import parse_key
from tests.idtracker.conftest import (
    USER_KEY,
    agent,
    read_line,
    run_tracker,
    start_tracker,
    tracker_cmd,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def test_openai_agent_is_attributed_and_backend_gets_real_key(
    router: StandInRouter, base_env: dict[str, str]
) -> None:
    done = run_tracker(router.url, base_env, agent("openai_agent.py", "3", "0"), "--slo", "25")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (start,) = router.starts
    assert report["agent_id"] == start.agent_id
    assert report["base_url"].rstrip("/") == f"{router.url}/v1"
    assert start.start.slo_tok_s == 25.0 and start.start.parent_id is None
    assert start.start.name == "python openai_agent.py"
    calls = router.api_calls
    assert len(calls) == 3
    assert {c.agent_id for c in calls} == {start.agent_id}
    assert {c.real_key for c in calls} == {USER_KEY}
    end = router.wait_end(start.agent_id)
    assert (end.exit_code, end.signal, end.reason) == (0, None, "exit")
    assert done.stderr == ""  # a healthy run adds nothing to the agent's stderr


@pytest.mark.parametrize(
    ("code", "cmd"),
    [
        (3, agent("openai_agent.py", "1", "3")),
        (255, ["sh", "-c", "exit 255"]),
        (1, [sys.executable, "-c", "raise RuntimeError('agent crashed')"]),
    ],
    ids=["openai-agent", "shell", "traceback"],
)
def test_crash_exit_code_passes_through_and_is_reported(
    router: StandInRouter, base_env: dict[str, str], code: int, cmd: list[str]
) -> None:
    done = run_tracker(router.url, base_env, cmd)
    assert done.returncode == code
    (start,) = router.starts
    end = router.wait_end(start.agent_id)
    assert (end.exit_code, end.signal, end.reason) == (code, None, "error")


def test_shell_agent_env_and_curl_attribution(
    router: StandInRouter, base_env: dict[str, str]
) -> None:
    base_env["ANTHROPIC_BASE_URL"] = router.url  # Anthropic pointed here by the user
    base_env["ANTHROPIC_API_KEY"] = USER_KEY
    done = run_tracker(router.url, base_env, agent("agent.sh", "7"))
    assert done.returncode == 7, done.stderr
    (start,) = router.starts
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert lines == {
        "agent": start.agent_id,
        "base": f"{router.url}/v1",
        "litellm": f"{router.url}/v1",
        "anthropic": router.url,
    }
    calls = [(c.path, c.via, c.agent_id, c.real_key) for c in router.api_calls]
    assert calls == [
        ("/v1/models", "authorization", start.agent_id, USER_KEY),
        ("/v1/models", "x-api-key", start.agent_id, USER_KEY),
    ]
    assert router.wait_end(start.agent_id).exit_code == 7


def test_nested_id_tracker_links_parent_and_never_nests_keys(
    router: StandInRouter, base_env: dict[str, str]
) -> None:
    done = run_tracker(router.url, base_env, agent("openai_agent.py", "1", "0", "--nested"))
    assert done.returncode == 0, done.stderr
    sub_report, parent_report = (json.loads(line) for line in done.stdout.splitlines())
    parent, sub = router.starts
    assert parent_report["agent_id"] == parent.agent_id and parent_report["nested_rc"] == 5
    assert sub_report["agent_id"] == sub.agent_id
    assert sub.start.parent_id == parent.agent_id and sub.start.name == "sub-agent"
    by_agent = {c.agent_id: c.real_key for c in router.api_calls}
    assert by_agent == {parent.agent_id: USER_KEY, sub.agent_id: USER_KEY}
    assert router.wait_end(sub.agent_id).exit_code == 5
    assert router.wait_end(parent.agent_id).exit_code == 0


def _sig_blocked(pid: int, tid: str) -> int:
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigBlk:")), 16)


def test_no_id_tracker_thread_leaves_the_watched_signals_unblocked(
    base_env: dict[str, str],
) -> None:
    """Signals are blocked per thread: a thread started before the block (e.g. a BLAS
    pool started by an import) would take SIGTERM and kill id-tracker mid-registration.

    The masks are read while id-tracker waits for the router's answer to its start
    call (a listener that reads the request and never answers): the main thread then
    sits in a socket read, not in sigtimedwait (which unblocks what it waits for), so
    every thread, the main one included, must show the watched signals blocked."""
    base_env["KAIROS_REQUEST_TIMEOUT_S"] = "60"  # the read outlasts the check
    with socket.create_server(("127.0.0.1", 0)) as silent:
        silent.settimeout(30)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        proc = start_tracker(url, base_env, ["true"], "--start-timeout-s", "60")
        try:
            conn, _ = silent.accept()
            with conn:
                conn.settimeout(30)
                request = b""
                while b"\r\n\r\n" not in request:  # the start call has left id-tracker
                    chunk = conn.recv(65536)
                    assert chunk, "id-tracker closed the connection before its request"
                    request += chunk
                tids = os.listdir(f"/proc/{proc.pid}/task")
                masks = {tid: _sig_blocked(proc.pid, tid) for tid in tids}
        finally:
            proc.kill()
            proc.wait(timeout=20)
    assert request.startswith(b"POST /kairos/v1/agents ")
    assert str(proc.pid) in masks  # the main thread was examined
    watched = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD]
    for tid, mask in masks.items():
        assert all(mask & (1 << (sig - 1)) for sig in watched), f"thread {tid}: {mask:#x}"


def test_kill_9_of_child_reports_signal_and_exits_137(
    router: StandInRouter, base_env: dict[str, str]
) -> None:
    proc = start_tracker(router.url, base_env, agent("signal_agent.py", "exit"))
    child_pid = int(read_line(proc).split()[1])
    os.kill(child_pid, signal.SIGKILL)
    assert proc.wait(timeout=20) == 128 + signal.SIGKILL
    (start,) = router.starts
    end = router.wait_end(start.agent_id)
    assert (end.exit_code, end.signal, end.reason) == (137, signal.SIGKILL, "signal")


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT], ids=lambda s: s.name
)
def test_signal_to_id_tracker_reaches_child(
    router: StandInRouter, base_env: dict[str, str], sig: signal.Signals
) -> None:
    proc = start_tracker(router.url, base_env, agent("signal_agent.py", "exit"))
    assert read_line(proc).startswith("ready")
    proc.send_signal(sig)
    assert read_line(proc) == f"got {sig.name}"  # the child's own handler ran
    assert proc.wait(timeout=20) == 100 + sig
    (start,) = router.starts
    end = router.wait_end(start.agent_id)
    assert (end.exit_code, end.reason) == (100 + sig, "terminated")


def test_sigterm_then_kill_after_grace_when_child_ignores_it(
    router: StandInRouter, base_env: dict[str, str]
) -> None:
    proc = start_tracker(
        router.url, base_env, agent("signal_agent.py", "ignore"), "--kill-grace-s", "0.3"
    )
    assert read_line(proc).startswith("ready")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 137
    (start,) = router.starts
    end = router.wait_end(start.agent_id)
    assert (end.exit_code, end.signal, end.reason) == (137, 9, "killed_after_grace")


def _wait_pid_gone(pid: int, timeout_s: float) -> bool:
    """True once ``pid`` has exited (pidfd: woken by the kernel, no polling)."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout_s)
        return bool(readable)
    finally:
        os.close(fd)


def test_sigkill_of_id_tracker_takes_the_child_down(
    router: StandInRouter, base_env: dict[str, str]
) -> None:
    proc = start_tracker(router.url, base_env, agent("signal_agent.py", "ignore"))
    child_pid = int(read_line(proc).split()[1])
    proc.kill()
    proc.wait(timeout=20)
    gone = _wait_pid_gone(child_pid, timeout_s=10)
    if not gone:  # do not leave the orphan behind when the test fails
        os.kill(child_pid, signal.SIGKILL)
    assert gone, "child orphaned after id-tracker SIGKILL"


def test_command_not_found_is_127_and_still_reported(
    router: StandInRouter, base_env: dict[str, str]
) -> None:
    done = run_tracker(router.url, base_env, ["/nonexistent/agent-binary"])
    assert done.returncode == 127
    assert "command not found" in done.stderr
    (start,) = router.starts
    end = router.wait_end(start.agent_id)
    assert (end.exit_code, end.reason) == (127, "spawn_failed")


def _dead_url() -> str:
    with StandInRouter() as r:
        return r.url  # nothing listens here once the block exits


def test_router_down_at_start_fails_clearly_without_running_child(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    done = run_tracker(_dead_url(), base_env, ["touch", str(marker)], "--start-timeout-s", "0.3")
    assert done.returncode == EXIT_ROUTER_UNAVAILABLE == 69
    assert "unreachable" in done.stderr and "connection refused" in done.stderr
    assert not marker.exists()


def test_stop_signal_cuts_registration_retries_short(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    with StandInRouter(start_status=503) as router:
        proc = start_tracker(
            router.url, base_env, ["touch", str(marker)], "--start-timeout-s", "60"
        )
        router.wait_start_attempts(1)  # it is retrying now
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM  # not after 60 s of retries
    assert not marker.exists() and router.starts == []


def test_fail_open_runs_child_untagged(base_env: dict[str, str]) -> None:
    base_env["OPENAI_BASE_URL"] = "http://user.example/v1"
    cmd = ["sh", "-c", 'echo "$OPENAI_BASE_URL|${KAIROS_AGENT_ID:-none}|$OPENAI_API_KEY"; exit 4']
    done = run_tracker(_dead_url(), base_env, cmd, "--fail-open", "--start-timeout-s", "0.2")
    assert done.returncode == 4
    assert done.stdout.strip() == f"http://user.example/v1|none|{USER_KEY}"
    assert "UNTAGGED" in done.stderr


def test_fail_open_from_environment(base_env: dict[str, str]) -> None:
    base_env["KAIROS_FAIL_OPEN"] = "true"
    base_env["KAIROS_START_TIMEOUT_S"] = "0.2"
    assert run_tracker(_dead_url(), base_env, ["true"]).returncode == 0


def test_router_unreachable_at_end_retries_then_exits_with_child_code(
    router: StandInRouter, base_env: dict[str, str]
) -> None:
    cmd = ["sh", "-c", "read line; exit 4"]
    proc = start_tracker(router.url, base_env, cmd, "--end-timeout-s", "0.5", stdin=subprocess.PIPE)
    router.wait_starts(1)
    router.stop()
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.close()
    assert proc.wait(timeout=20) == 4
    assert proc.stderr is not None
    stderr = proc.stderr.read()
    assert "could not report agent end" in stderr and "connection refused" in stderr


def test_router_failing_end_calls_is_retried_with_backoff(base_env: dict[str, str]) -> None:
    with StandInRouter(end_status=503) as router:
        done = run_tracker(router.url, base_env, ["sh", "-c", "exit 6"], "--end-timeout-s", "0.6")
        assert done.returncode == 6
        assert router.end_attempts >= 3  # 0.1 s, 0.2 s, … backoff inside 0.6 s
        assert "could not report agent end" in done.stderr


def test_control_token_from_env_and_file(base_env: dict[str, str], tmp_path: Path) -> None:
    with StandInRouter(control_token="ctl-secret") as router:
        assert run_tracker(router.url, base_env, ["true"]).returncode == EXIT_REJECTED
        base_env["KAIROS_CONTROL_TOKEN"] = "ctl-secret"
        # The agent never receives a control credential (docs/design.md §9).
        show = ["sh", "-c", 'echo "[$KAIROS_CONTROL_TOKEN][$KAIROS_CONTROL_TOKEN_FILE]"']
        done = run_tracker(router.url, base_env, show)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[][]"
        del base_env["KAIROS_CONTROL_TOKEN"]
        token_file = tmp_path / "token"
        token_file.write_text("ctl-secret\n")
        done = run_tracker(router.url, base_env, show, "--control-token-file", str(token_file))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[][]"
        assert {s.authorization for s in router.starts} == {"Bearer ctl-secret"}
        assert "ctl-secret" not in done.stderr


def test_python_dash_m_and_console_script_are_the_same_cli() -> None:
    module = subprocess.run(tracker_cmd("--help"), capture_output=True, text=True, check=True)
    assert "--router-url" in module.stdout and "--fail-open" in module.stdout
    assert "Usage: id-tracker" in module.stdout


def test_key_handed_to_child_parses_back(router: StandInRouter, base_env: dict[str, str]) -> None:
    done = run_tracker(router.url, base_env, ["sh", "-c", 'echo "$OPENAI_API_KEY"'])
    parsed = parse_key(done.stdout.strip())
    assert parsed.agent_id == router.starts[0].agent_id and parsed.real_key == USER_KEY


def test_inherited_file_descriptors_pass_through(
    router: StandInRouter, base_env: dict[str, str]
) -> None:
    read_fd, write_fd = os.pipe()
    try:
        cmd = [sys.executable, "-c", f"import os; os.write({write_fd}, b'via-fd\\n')"]
        proc = start_tracker(router.url, base_env, cmd, pass_fds=(write_fd,))
        os.close(write_fd)
        assert proc.wait(timeout=20) == 0
        with os.fdopen(read_fd) as pipe:
            read_fd = -1
            assert pipe.read() == "via-fd\n"
    finally:
        if read_fd >= 0:
            os.close(read_fd)


@pytest.mark.parametrize(
    ("flags", "code", "message"),
    [
        (("--router-url", "localhost:24157"), 78, "expected http(s)://host:port"),
        (("--slo", "0"), 78, "--slo 0: expected a positive"),
        (("--kill-grace-s", "-1"), 78, "must not be negative"),
        (("--summary-wait-s", "61"), 78, "summary_wait_s must be within [0, 60]"),
        (("--router-url", "http://127.0.0.1:9", "--config", "/nonexistent.toml"), 78, "does not"),
    ],
)
def test_configuration_errors_exit_78_before_anything_runs(
    base_env: dict[str, str], flags: tuple[str, ...], code: int, message: str
) -> None:
    done = subprocess.run(
        tracker_cmd(*flags, "--", "true"), env=base_env, capture_output=True, text=True
    )
    assert done.returncode == code and message in done.stderr


def test_missing_command_is_a_usage_error(base_env: dict[str, str]) -> None:
    done = subprocess.run(tracker_cmd("--name", "x"), env=base_env, capture_output=True)
    assert done.returncode == 2
