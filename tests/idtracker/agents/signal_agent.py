"""Test agent: reports the signals it gets on stdout.

usage: signal_agent.py MODE
  exit   exit with 100+N on signal N (INT, TERM, HUP, QUIT)
  ignore ignore SIGTERM (to exercise the kill grace period)
  count  count SIGINTs; on SIGUSR1 print the count and exit 0; print CONT on SIGCONT

Prints "ready <pid> foreground|no-tty" once its handlers are installed (foreground:
stdin is a terminal whose foreground process group is ours), then waits.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def main() -> None:
    mode = sys.argv[1]
    sigints = 0

    def on_exit_signal(signum: int, _frame: FrameType | None) -> None:
        print(f"got {signal.Signals(signum).name}", flush=True)
        os._exit(100 + signum)

    def on_int(_signum: int, _frame: FrameType | None) -> None:
        nonlocal sigints
        sigints += 1
        print(f"INT {sigints}", flush=True)

    def on_cont(_signum: int, _frame: FrameType | None) -> None:
        print("CONT", flush=True)

    def on_usr1(_signum: int, _frame: FrameType | None) -> None:
        print(f"COUNT {sigints}", flush=True)
        os._exit(0)

    if mode == "exit":
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, on_exit_signal)
    elif mode == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif mode == "count":
        signal.signal(signal.SIGINT, on_int)
        signal.signal(signal.SIGUSR1, on_usr1)
        signal.signal(signal.SIGCONT, on_cont)
    wakeup = _wakeup_pipe()
    foreground = os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    print(f"ready {os.getpid()} {'foreground' if foreground else 'no-tty'}", flush=True)
    while True:
        os.read(wakeup, 64)  # handlers run as the read is interrupted or returns


def _wakeup_pipe() -> int:
    """A pipe the C-level signal handler writes each signal number to.

    ``signal.pause()`` loses a signal that lands after Python last ran its handlers
    and before the ``pause`` syscall: the handler is flagged but never run, and the
    process sleeps until some later signal. Blocking on this pipe cannot miss one.
    """
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    return read_end


if __name__ == "__main__":
    main()
