"""Spawn the agent, forward signals to it, wait for it — without polling.

Design (why it looks like this):

* **One process group.** The child stays in id-tracker's process group, so
  the shell's job control (Ctrl-Z, ``fg``, ``bg``), terminal reads and SIGWINCH
  work exactly as if the agent had been started directly, and stdin/stdout/
  stderr are simply inherited (never piped).
* **Signals are read, not handled.** SIGCHLD and the forwarded signals are
  blocked and consumed with ``sigwaitinfo``/``sigtimedwait``: the supervisor
  sleeps in the kernel until the child changes state or a signal arrives, and
  it gets the ``siginfo`` that tells who sent the signal.
* **Ctrl-C once, not twice.** A signal the terminal generated (``si_code ==
  SI_KERNEL``) went to the whole foreground process group, so the child
  already has it; it is forwarded only when the child has left our group.
  Signals sent with ``kill(2)`` (``kill <pid>``, ``docker stop``, a harness's
  ``Popen.terminate``) are forwarded.
* **No orphans.** SIGTERM to id-tracker is forwarded, then the child gets
  ``kill_grace_s`` before SIGKILL. If id-tracker itself is SIGKILLed, the
  kernel SIGKILLs the child (``PR_SET_PDEATHSIG``, Linux).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from idtracker.errors import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, SpawnError

log = structlog.get_logger()

FORWARDED_SIGNALS: frozenset[int] = frozenset(
    {
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
    }
)
WATCHED_SIGNALS: frozenset[int] = FORWARDED_SIGNALS | {signal.SIGCHLD}
STOP_SIGNALS: frozenset[int] = frozenset(
    {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}
)
SI_KERNEL = 0x80  # <asm-generic/siginfo.h>: sent by the kernel (tty driver), not kill(2)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

Clock = Callable[[], float]


class SignalGate:
    """Blocks the watched signals so they queue up until :meth:`wait` reads them."""

    def __init__(self) -> None:
        self.original_mask: frozenset[int] = frozenset()

    def block(self) -> None:
        """Block for the rest of the process's life; the child gets the mask from before."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED_SIGNALS)
        self.original_mask = frozenset(int(s) for s in old)

    def wait(
        self, timeout_s: float | None, signals: Iterable[int] = WATCHED_SIGNALS
    ) -> signal.struct_siginfo | None:
        """Next watched signal, or None once ``timeout_s`` passes (None: wait forever)."""
        if timeout_s is None:
            return signal.sigwaitinfo(signals)
        return signal.sigtimedwait(signals, max(0.0, timeout_s))

    def wait_unless_stopped(self, delay_s: float) -> int | None:
        """A lifecycle-client waiter: sleep ``delay_s`` unless a stop signal comes."""
        info = self.wait(delay_s, STOP_SIGNALS)
        return None if info is None else info.si_signo


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """How the agent ended, in the shape of :class:`kairos_common.wire.AgentEnd`.

    ``reason``: ``exit`` (status 0), ``error`` (non-zero), ``signal`` (killed by
    a signal), ``terminated`` (ended after id-tracker was asked to stop),
    ``killed_after_grace`` (did not stop within the grace period after SIGTERM);
    :mod:`idtracker.launch` adds ``spawn_failed`` and ``cancelled``.
    """

    exit_code: int
    signal: int | None
    reason: str


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    prctl: Callable[..., int] | None = getattr(libc, "prctl", None)
    return prctl


class _ChildSetup:
    """Runs in the forked child before exec: restore the mask, arm the death signal."""

    def __init__(self, parent_pid: int, mask: frozenset[int]) -> None:
        self._parent_pid = parent_pid
        self._mask = mask
        self._prctl = _load_prctl()  # loaded before fork: no dlopen in the child

    def __call__(self) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
        if self._prctl is not None:
            self._prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != self._parent_pid:  # parent died before prctl took effect
                os.kill(os.getpid(), signal.SIGKILL)


def spawn(cmd: list[str], env: dict[str, str], gate: SignalGate) -> subprocess.Popen[bytes]:
    """Start CMD with inherited stdio and file descriptors and the caller's signal mask."""
    try:
        return subprocess.Popen(
            cmd,
            env=env,
            close_fds=False,  # a transparent wrapper keeps descriptors the harness passed
            preexec_fn=_ChildSetup(os.getpid(), gate.original_mask),  # single-threaded here
        )
    except FileNotFoundError:
        raise SpawnError(f"{cmd[0]}: command not found", EXIT_NOT_FOUND) from None
    except PermissionError:
        raise SpawnError(f"{cmd[0]}: permission denied", EXIT_NOT_EXECUTABLE) from None
    except OSError as exc:
        raise SpawnError(f"{cmd[0]}: {exc.strerror or exc}", EXIT_NOT_EXECUTABLE) from None


def should_forward(info: signal.struct_siginfo, child_pid: int) -> bool:
    """False for terminal-generated signals the child received itself (same group)."""
    if info.si_code != SI_KERNEL:
        return True
    try:
        return os.getpgid(child_pid) != os.getpgrp()
    except ProcessLookupError:
        return False


def _send(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # exited; its SIGCHLD is on the way
        os.kill(pid, signum)


def _reap(proc: subprocess.Popen[bytes]) -> int | None:
    """The child's wait status if it has exited, else None (never blocks)."""
    try:
        pid, status = os.waitpid(proc.pid, os.WNOHANG)
    except ChildProcessError:  # someone else reaped it (cannot happen in id-tracker)
        log.warning("agent status lost: already reaped", pid=proc.pid)
        return 0
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)  # keeps Popen from re-reaping
    return status


def _outcome(status: int, stop_requested: bool, killed: bool) -> ChildOutcome:
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        code, sig = 128 + signum, signum
    else:
        code, sig = os.WEXITSTATUS(status), None
    if killed:
        reason = "killed_after_grace"
    elif stop_requested:
        reason = "terminated"
    elif sig is not None:
        reason = "signal"
    else:
        reason = "exit" if code == 0 else "error"
    return ChildOutcome(exit_code=code, signal=sig, reason=reason)


def supervise(
    proc: subprocess.Popen[bytes],
    gate: SignalGate,
    *,
    kill_grace_s: float,
    clock: Clock,
) -> ChildOutcome:
    """Forward signals until the child exits; SIGKILL it ``kill_grace_s`` after a SIGTERM."""
    kill_at: float | None = None
    killed = False
    stop_requested = False
    while True:
        info = gate.wait(None if kill_at is None else kill_at - clock())
        if info is None:  # grace period over
            log.warning("agent ignored SIGTERM; killing it", pid=proc.pid, grace_s=kill_grace_s)
            _send(proc.pid, signal.SIGKILL)
            killed, kill_at = True, None
            continue
        signum = info.si_signo
        if signum == signal.SIGCHLD:
            status = _reap(proc)
            if status is not None:
                return _outcome(status, stop_requested, killed)
            continue
        stop_requested = stop_requested or signum in STOP_SIGNALS
        if should_forward(info, proc.pid):
            log.info("forwarding signal", signal=signal.Signals(signum).name, pid=proc.pid)
            _send(proc.pid, signum)
        if signum == signal.SIGTERM and kill_at is None and not killed:
            kill_at = clock() + kill_grace_s
