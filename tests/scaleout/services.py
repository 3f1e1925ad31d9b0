"""The real services a scale-out test needs, started by the test on 127.0.0.1:
``redis-server`` and ``haproxy`` (Debian 12: Redis 7.0, HAProxy 2.6).

Each starter is a context manager that starts the binary on free ports with the
given configuration, waits (bounded) until it serves, and stops it on every
path out, a failing test included: SIGTERM, then SIGKILL after a grace. A paused
process (:meth:`Service.pause`) is resumed before it is stopped.

Where a binary is missing, :func:`skip_unless` skips the test saying which and
how to install it (``make test`` installs both where it can: root on Debian).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from simulator.stack import free_port

REDIS_SERVER = "redis-server"
HAPROXY = "haproxy"
PAIR_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "kairos-pair.cfg"
"""The HAProxy configuration shipped for a router pair (deploy/haproxy/)."""
START_TIMEOUT_S = 15.0
STOP_GRACE_S = 10.0


def missing(*binaries: str) -> str | None:
    """Why the scale-out tier cannot run here (None: every binary is on PATH)."""
    absent = [b for b in binaries if shutil.which(b) is None]
    if not absent:
        return None
    return (
        f"{', '.join(absent)} not installed (Debian: apt-get install -y redis-server haproxy; "
        "`make test` does it when run as root with apt)"
    )


def skip_unless(*binaries: str) -> None:
    """Skip the calling test, saying why, unless every binary is installed."""
    reason = missing(*binaries)
    if reason is not None:
        pytest.skip(reason)


def wait_port(port: int, timeout_s: float, probe: bytes = b"", expect: bytes = b"") -> bool:
    """Poll 127.0.0.1:``port`` until it accepts (and answers ``probe`` with a reply
    starting with ``expect``), bounded by ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5) as s:
            if not probe:
                return True
            s.settimeout(0.5)
            s.sendall(probe)
            if s.recv(64).startswith(expect):
                return True
        time.sleep(0.05)  # polling a starting process, bounded by the deadline
    return False


class Service:
    """One started process with its log file."""

    def __init__(self, name: str, argv: list[str], workdir: Path, env: Mapping[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.workdir = workdir
        self.env = dict(env)
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.workdir,
                env={**os.environ, **self.env},
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal(self, sig: signal.Signals) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        self._signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(STOP_GRACE_S)

    def stop(self) -> None:
        """SIGTERM (a paused process is resumed first), SIGKILL after the grace."""
        if self.proc is None:
            return
        if self.paused:
            self.resume()
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class RedisServer(Service):
    """``redis-server`` on a free loopback port; AOF on, so a restart keeps the data
    as a production Redis would (``appendonly=False``: a restart starts empty)."""

    def __init__(self, workdir: Path, *, appendonly: bool = True) -> None:
        self.port = free_port()
        data = workdir / "redis-data"
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
            "--protected-mode", "no", "--save", "", "--dir", str(data),
            "--appendonly", "yes" if appendonly else "no", "--appendfsync", "everysec",
            "--loglevel", "warning",
        ]  # fmt: skip
        super().__init__("redis", argv, workdir, {})

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        super().start()
        if not wait_port(self.port, START_TIMEOUT_S, b"PING\r\n", b"+PONG"):
            self.stop()
            raise RuntimeError(f"redis-server did not answer PING; see {self.log}:\n{self.tail()}")

    def restart(self) -> None:
        """Stop (SIGTERM: Redis syncs its AOF) and start again on the same port."""
        self.stop()
        self.start()


class Haproxy(Service):
    """``haproxy -db -f CONFIG`` with the environment the configuration expands."""

    def __init__(self, config: Path, workdir: Path, env: Mapping[str, str], front_port: int):
        super().__init__("haproxy", [HAPROXY, "-db", "-f", str(config)], workdir, env)
        self.front_port = front_port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.front_port}"

    def start(self) -> None:
        super().start()
        if not wait_port(self.front_port, START_TIMEOUT_S):
            self.stop()
            raise RuntimeError(f"haproxy did not listen; see {self.log}:\n{self.tail()}")


@contextlib.contextmanager
def redis_server(workdir: Path, *, appendonly: bool = True) -> Iterator[RedisServer]:
    """A running ``redis-server``, stopped on exit."""
    skip_unless(REDIS_SERVER)
    server = RedisServer(workdir, appendonly=appendonly)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def haproxy(
    config: Path, workdir: Path, env: Mapping[str, str], front_port: int
) -> Iterator[Haproxy]:
    """A running ``haproxy`` with ``config`` (``env`` fills its ``"${VAR}"``), whose
    front listens on ``front_port``; stopped on exit."""
    skip_unless(HAPROXY)
    proxy = Haproxy(config, workdir, env, front_port)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@contextlib.contextmanager
def pair_front(workdir: Path, router_a: str, router_b: str) -> Iterator[Haproxy]:
    """HAProxy with the shipped pair configuration in front of two routers
    (``host:port`` each) on a free front port."""
    port = free_port()
    env = {"KAIROS_FRONT": f"127.0.0.1:{port}", "KAIROS_ROUTER_A": router_a,
           "KAIROS_ROUTER_B": router_b}  # fmt: skip
    with haproxy(PAIR_CONFIG, workdir, env, port) as proxy:
        yield proxy
