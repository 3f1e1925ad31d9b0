"""Terminal behaviour: id-tracker under a real pseudo-terminal, as a user would run it."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import termios

import pytest

from idtracker.testing import StandInRouter
from tests.idtracker.conftest import REPO, agent, tracker_cmd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


class Pty:
    """The master side of a pty; lines are read with a bounded select, never a sleep."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        self._buf = b""

    def read_until(self, needle: bytes, timeout_s: float = 15.0) -> bytes:
        while needle not in self._buf:
            ready, _, _ = select.select([self.master], [], [], timeout_s)
            if not ready:
                raise TimeoutError(f"no {needle!r} on the terminal; got {self._buf!r}")
            self._buf += os.read(self.master, 4096)
        head, _, self._buf = self._buf.partition(needle)
        return head + needle

    def close(self) -> None:
        os.close(self.master)


def _make_controlling_tty() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_ctrl_c_reaches_foreground_child_exactly_once(
    router: StandInRouter, base_env: dict[str, str]
) -> None:
    pty = Pty()
    proc = subprocess.Popen(
        tracker_cmd("--router-url", router.url, "--", *agent("signal_agent.py", "count")),
        stdin=pty.slave,
        stdout=pty.slave,
        stderr=pty.slave,
        env=base_env,
        cwd=REPO,
        start_new_session=True,  # its own session, with the pty as controlling terminal
        preexec_fn=_make_controlling_tty,
    )
    os.close(pty.slave)
    try:
        assert pty.read_until(b"\n").strip().endswith(b"foreground")  # owns the terminal
        os.write(pty.master, b"\x03")  # Ctrl-C: the tty sends SIGINT to the foreground group
        pty.read_until(b"INT 1")
        # SIGUSR1 is forwarded after any (wrong) extra SIGINT id-tracker could have sent,
        # and a process runs lower-numbered signal handlers first: the count is final.
        proc.send_signal(signal.SIGUSR1)
        pty.read_until(b"COUNT ")
        count = int(pty.read_until(b"\n").strip())
        assert proc.wait(timeout=20) == 0
    finally:
        pty.close()
    assert count == 1, "the child got Ctrl-C twice (id-tracker forwarded a tty signal)"
    end = router.wait_end(router.starts[0].agent_id)
    assert (end.exit_code, end.reason) == (0, "terminated")


def test_job_control_under_an_interactive_shell(
    router: StandInRouter, base_env: dict[str, str]
) -> None:
    """Ctrl-Z stops the whole job, ``fg`` resumes it, Ctrl-C still arrives once."""
    pty = Pty()
    env = dict(base_env, PS1="PROMPT$ ", TERM="dumb")
    bash = subprocess.Popen(
        ["bash", "--norc", "--noprofile", "-i"],
        stdin=pty.slave,
        stdout=pty.slave,
        stderr=pty.slave,
        env=env,
        cwd=REPO,
        start_new_session=True,
        preexec_fn=_make_controlling_tty,
    )
    os.close(pty.slave)
    command = " ".join(
        tracker_cmd("--router-url", router.url, "--", *agent("signal_agent.py", "count"))
    )
    try:
        pty.read_until(b"PROMPT$ ")
        os.write(pty.master, command.encode() + b"\n")
        pty.read_until(b"foreground")
        os.write(pty.master, b"\x1a")  # Ctrl-Z: the shell sees the job (id-tracker) stop
        pty.read_until(b"Stopped")
        pty.read_until(b"PROMPT$ ")
        os.write(pty.master, b"fg\n")
        pty.read_until(b"CONT")  # the agent was continued along with id-tracker
        os.write(pty.master, b"\x03")
        pty.read_until(b"INT 1")
        os.write(pty.master, b"\x1a")
        pty.read_until(b"PROMPT$ ")
        # signal id-tracker alone (the job's leader); it forwards once the job runs again
        os.write(pty.master, b"kill -USR1 $(jobs -p %1); fg\n")
        pty.read_until(b"COUNT ")
        count = int(pty.read_until(b"\n").strip())
        pty.read_until(b"PROMPT$ ")
        os.write(pty.master, b"echo rc=$?\n")
        pty.read_until(b"rc=0")
        os.write(pty.master, b"exit\n")
        assert bash.wait(timeout=20) == 0
    finally:
        if bash.poll() is None:
            os.killpg(bash.pid, signal.SIGKILL)
            bash.wait()
        pty.close()
    assert count == 1
    end = router.wait_end(router.starts[0].agent_id)
    assert (end.exit_code, end.reason) == (0, "terminated")
