"""A router pair on one Redis behind HAProxy, with two fake vLLM instances, their
kairosd and agents launched through id-tracker: every part a real process on
127.0.0.1 (the scale-out tier's end-to-end setup).

Clients (kairosd, id-tracker, the agents) know one address, the HAProxy front,
and the first router's credentials: a router started later accepts them through
the digests the store keeps. A killed router is replaced on its own port by a
fresh one (new state directory, new credentials), which starts as the standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kairos_common.wire import READY_PATH
from router.redis_store import RedisStore
from router.store import Snapshot
from simulator.stack import free_port
from tests.scaleout.services import Haproxy, RedisServer, Service, pair_front, redis_server

BIN = Path(sys.executable).parent
AGENT = Path(__file__).parent / "agents" / "stream_agent.py"
SPEEDUP = 20.0


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, every_s: float = 0.05) -> None:
    """Poll ``check`` until it holds; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(every_s)  # polling real processes, bounded by the deadline


@dataclass
class Router:
    service: Service
    port: int
    state: Path
    slot: str = ""
    """HAProxy's server name for it (``a`` or ``b``)."""
    started_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def records(self) -> Path:
        return self.state / "agents.jsonl"

    def ready(self) -> dict[str, Any] | None:
        """Its ``/health/ready`` body (None: it does not answer)."""
        got = http_get(self.url + READY_PATH)
        if got is None:
            return None
        try:
            return dict(json.loads(got[1]))
        except ValueError:
            return None

    def role(self) -> str | None:
        body = self.ready()
        return None if body is None else str(body.get("role"))

    def log_events(self, event: str) -> list[dict[str, Any]]:
        out = []
        for line in self.service.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict) and obj.get("event") == event:
                    out.append(obj)
        return out


@dataclass
class Agent:
    name: str
    log: Path
    service: Service

    def entries(self) -> list[dict[str, Any]]:
        try:
            lines = self.log.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out


@dataclass
class Cluster:
    workdir: Path
    redis: RedisServer
    routers: dict[str, Router] = field(default_factory=dict)
    front: Haproxy | None = None
    services: list[Service] = field(default_factory=list)
    agents: list[Agent] = field(default_factory=list)
    vllm_urls: list[str] = field(default_factory=list)
    credentials: Path | None = None
    """The first router's credentials directory: what every client uses."""
    stop_file: Path = Path()
    pause_file: Path = Path()
    generation: int = 0

    @property
    def front_url(self) -> str:
        assert self.front is not None
        return self.front.url

    def _service(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Service:
        service = Service(name, argv, self.workdir, {"PYTHONUNBUFFERED": "1", **(env or {})})
        service.start()
        self.services.append(service)
        return service

    def start_vllm(self, i: int) -> None:
        port = free_port()
        self._service(f"vllm-i{i}", [str(BIN / "kairos"), "fake-vllm", "--port", str(port),
                      "--speedup", str(SPEEDUP), "--enable-prompt-tokens-details"])  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        wait_for(f"fake vLLM {url}", lambda: _get_ok(url + "/health"), 30)
        self.vllm_urls.append(url)

    def start_router(
        self, slot: str, port: int | None = None, *, standby: bool = False, **env: str
    ) -> Router:
        """A router in ``slot`` (``a`` or ``b``): a fresh state directory each time;
        ``standby``: wait until it stands by (it has seen the leader's lease)."""
        self.generation += 1
        port = port or free_port()
        state = self.workdir / f"router-{slot}-{self.generation}"
        argv = [str(BIN / "kairos-router"), "run", "--port", str(port), "--store", self.redis.url,
                "--state-dir", str(state), "--advertise-url", f"http://127.0.0.1:{port}",
                "--log-json", "--run", "scaleout"]  # fmt: skip
        for i, url in enumerate(self.vllm_urls):
            argv += ["--backend", f"i{i}={url}"]
        started_s = time.time()
        service = self._service(f"router-{slot}-{self.generation}", argv, env)
        router = Router(service, port, state, slot, started_s)
        self.routers[slot] = router
        wait_for(f"router {slot} to answer", lambda: router.ready() is not None, 30)
        if self.credentials is None:
            self.credentials = state / "credentials"
        if standby:
            wait_for(f"router {slot} to stand by",
                     lambda: "leader_url" in (router.ready() or {}), 30)  # fmt: skip
        return router

    def leader(self) -> Router:
        for router in self.routers.values():
            if router.service.running() and router.role() == "leader":
                return router
        raise AssertionError("no leader")

    def start_daemon(self, i: int) -> None:
        assert self.credentials is not None
        epoch_s = 5.0 / SPEEDUP
        self._service(
            f"kairosd-i{i}",
            [str(BIN / "kairosd"), "run", "--instance", f"i{i}", "--vllm-url", self.vllm_urls[i],
             "--router-url", self.front_url, "--gpu-backend", "sim", "--epoch-s", str(epoch_s),
             "--listen-port", str(free_port()), "--report", str(self.workdir / f"kd-i{i}.jsonl"),
             "--log-json"],
            {"KAIROSD_ROUTER_TOKEN_FILE": str(self.credentials / f"daemon-i{i}.token"),
             "KAIROSD_HTTP_TIMEOUT_S": str(epoch_s / 2), "KAIROSD_GPU_TIMEOUT_S": str(epoch_s / 2)},
        )  # fmt: skip

    def start_agent(self, k: int, think_s: float) -> Agent:
        assert self.credentials is not None
        log = self.workdir / f"agent-{k}.jsonl"
        service = self._service(
            f"idtracker-{k}",
            [str(BIN / "id-tracker"), "--name", f"agent-{k}", "--", sys.executable, str(AGENT),
             str(log), str(self.stop_file), str(think_s), str(self.pause_file)],
            {"KAIROS_ROUTER_URL": self.front_url, "OPENAI_API_KEY": f"sk-real-{k}",
             "KAIROS_CONTROL_TOKEN_FILE": str(self.credentials / "lifecycle.token")},
        )  # fmt: skip
        agent = Agent(f"agent-{k}", log, service)
        self.agents.append(agent)
        return agent

    def snapshot(self) -> Snapshot:
        """What the store holds now (read by a client of its own, not a router)."""

        async def read() -> Snapshot:
            store = RedisStore(self.redis.url)
            try:
                return await store.load()
            finally:
                await store.close()

        return asyncio.run(read())

    def pause_agents(self) -> None:
        """Agents send nothing more; returns once every one has finished its request
        in flight and says it is paused."""
        self.pause_file.touch()
        wait_for("agents to pause", lambda: all(
            Path(f"{a.log}.paused").exists() for a in self.agents if a.service.running()
        ), 30)  # fmt: skip

    def resume_agents(self) -> None:
        self.pause_file.unlink(missing_ok=True)
        wait_for("agents to go on", lambda: not any(
            Path(f"{a.log}.paused").exists() for a in self.agents
        ), 30)  # fmt: skip

    def stream_writers(self, after_id: str = "0-0") -> list[tuple[str, str]]:
        """``(stream id, writer router id)`` of every batch in the store's change stream."""

        async def read() -> list[tuple[str, str]]:
            store = RedisStore(self.redis.url)
            try:
                entries = await store._redis.xrange(store.keys["changes"], min=f"({after_id}")
                return [(i, f.get("w", "")) for i, f in entries]
            finally:
                await store.close()

        return asyncio.run(read())

    def stop_agents(self, timeout_s: float = 30) -> None:
        self.stop_file.touch()
        wait_for("agents to end", lambda: not any(a.service.running() for a in self.agents),
                 timeout_s)  # fmt: skip


def first_success_after(cluster: Cluster, t_s: float) -> dict[str, float]:
    """Per agent: when its first request that succeeded after ``t_s`` ended."""
    out = {}
    for agent in cluster.agents:
        done = [e["t1"] for e in agent.entries() if e.get("ok") and e["t1"] > t_s]
        if done:
            out[agent.name] = min(done)
    return out


@contextlib.contextmanager
def running_cluster(workdir: Path, *, agents: int, think_s: float = 0.2) -> Iterator[Cluster]:
    """Redis, two fake vLLMs, router pair (a leads), HAProxy, two kairosd, ``agents``
    agents streaming through id-tracker; everything stopped on exit."""
    with redis_server(workdir) as redis:
        cluster = Cluster(workdir, redis, stop_file=workdir / "stop-agents",
                          pause_file=workdir / "pause-agents")  # fmt: skip
        try:
            for i in range(2):
                cluster.start_vllm(i)
            a = cluster.start_router("a")
            wait_for("router a to lead", lambda: a.role() == "leader", 15)
            b = cluster.start_router("b", standby=True)
            with pair_front(workdir, f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}") as front:
                cluster.front = front
                wait_for("the front to reach the leader",
                         lambda: _get_ok(front.url + READY_PATH), 15)  # fmt: skip
                for i in range(2):
                    cluster.start_daemon(i)
                for k in range(agents):
                    cluster.start_agent(k, think_s)
                wait_for("every agent to complete two turns",
                         lambda: all(sum(e.get("ok", False) for e in ag.entries()) >= 2
                                     for ag in cluster.agents), 90)  # fmt: skip
                yield cluster
        finally:
            cluster.stop_file.touch()
            for service in reversed(cluster.services):
                service.stop()


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes] | None:
    """``(status, body)`` of a GET (None: no answer within a second)."""
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310 (loopback)
    try:
        with urllib.request.urlopen(request, timeout=1.0) as resp:  # noqa: S310
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError):
        return None


def _get_ok(url: str) -> bool:
    got = http_get(url)
    return got is not None and got[0] == 200
