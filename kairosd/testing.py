"""Fakes for tests and demos: a vLLM-style server with a simulated GPU, and a
Kairos router's control endpoints. Real aiohttp servers on 127.0.0.1 (port 0),
so the daemon under test uses its real HTTP clients.

Both are deliberately small and deterministic: they change only when a test
tells them to (or when a request arrives), and they record what they received
so tests assert on behaviour, not on mocks.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from controllers.types import AgentView
from kairos_common.leader import not_leader_reply
from kairos_common.simgpu import SIM_GPU_PREFIX, SimGpuState
from kairos_common.wire import (
    API_PREFIX,
    WIRE_VERSION,
    AdmissionDecision,
    DecisionAck,
    InstanceState,
)

H100_LIKE_CLOCKS_MHZ = tuple(range(210, 1981, 15))


class _Served:
    """An aiohttp app bound to 127.0.0.1 on a free port."""

    def __init__(self) -> None:
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.changed = asyncio.Event()

    def _signal(self) -> None:
        """Wake every :meth:`wait_for` (they re-check their condition)."""
        self.changed.set()
        self.changed = asyncio.Event()

    async def wait_for(self, cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
        """Wait (bounded) until ``cond()`` holds; re-checked on every change."""
        async with asyncio.timeout(timeout_s):
            while not cond():
                await self.changed.wait()

    def app(self) -> web.Application:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else 0
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@dataclass
class FakeGpu:
    """A simulated GPU: power grows with clock; energy integrates power over time."""

    index: int
    name: str = "Fake H100"
    supported_clocks_mhz: tuple[int, ...] = H100_LIKE_CLOCKS_MHZ
    locked_mhz: int | None = None
    energy_mj: int = 0
    idle_w: float = 100.0
    w_per_mhz: float = 0.3

    @property
    def clock_mhz(self) -> int:
        return self.locked_mhz if self.locked_mhz is not None else self.supported_clocks_mhz[-1]

    @property
    def power_w(self) -> float:
        return self.idle_w + self.w_per_mhz * self.clock_mhz

    def advance(self, dt_s: float) -> None:
        self.energy_mj += round(self.power_w * max(dt_s, 0.0) * 1000)

    def state(self) -> SimGpuState:
        return SimGpuState(
            index=self.index,
            name=self.name,
            supported_clocks_mhz=self.supported_clocks_mhz,
            locked_min_mhz=self.locked_mhz,
            locked_max_mhz=self.locked_mhz,
            current_clock_mhz=self.clock_mhz,
            energy_mj=self.energy_mj,
            power_w=self.power_w,
        )


@dataclass
class VllmState:
    """What the fake's ``/metrics`` reports. ``mode``: ok, down, malformed, nan,
    disabled (as with ``--disable-log-stats``) or hang (never answers)."""

    capacity_tokens: int = 100_000
    kv_usage_frac: float = 0.0
    running: int = 0
    waiting: int = 0
    preemptions_total: int = 0
    generation_tokens_total: int = 0
    prompt_tokens_total: int = 0
    mode: str = "ok"
    legacy_names: bool = False
    kv_offloading_size: str | None = None
    """The ``kv_offloading_size`` label as vLLM writes it (``"None"``, ``"192.0"``);
    None leaves the label out (older vLLM)."""


def vllm_metrics_text(s: VllmState) -> str:
    """vLLM 0.33-style exposition text (legacy names when ``legacy_names``)."""
    lbl = 'engine="0",model_name="fake"'
    usage = "vllm:gpu_cache_usage_perc" if s.legacy_names else "vllm:kv_cache_usage_perc"
    cap = (
        f'block_size="16",engine="0",num_gpu_blocks="{s.capacity_tokens // 16}"'
        if s.legacy_names
        else f'block_size="16",engine="0",kv_cache_size_tokens="{s.capacity_tokens}",'
        f'num_gpu_blocks="{s.capacity_tokens // 16}"'
    )
    if s.kv_offloading_size is not None:
        cap += f',kv_offloading_size="{s.kv_offloading_size}"'
    return "\n".join(
        [
            "# TYPE vllm:cache_config_info gauge",
            f"vllm:cache_config_info{{{cap}}} 1.0",
            f"# TYPE {usage} gauge",
            f"{usage}{{{lbl}}} {s.kv_usage_frac}",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{lbl}}} {s.running}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{lbl}}} {s.waiting}",
            "# TYPE vllm:num_preemptions counter",
            f"vllm:num_preemptions_total{{{lbl}}} {s.preemptions_total}",
            "# TYPE vllm:generation_tokens counter",
            f"vllm:generation_tokens_total{{{lbl}}} {s.generation_tokens_total}",
            "# TYPE vllm:prompt_tokens counter",
            f"vllm:prompt_tokens_total{{{lbl}}} {s.prompt_tokens_total}",
            "",
        ]
    )


_PROCESS_ONLY = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"


class ScriptedVllm(_Served):
    """``/metrics`` plus the simulated-GPU endpoints of :mod:`kairos_common.simgpu`.

    Scripted: its numbers are what a test sets (``vllm``, ``gpus``), nothing is
    served or simulated. The fake *engine* that answers chat completions is
    :class:`simulator.fakevllm.FakeVllm`.

    ``clock`` drives energy accrual: energy advances by power × elapsed clock
    time whenever the GPUs are read (tests pass a manual clock to control it).
    ``deny_control`` answers 403 to clock writes, like an unprivileged host;
    ``gpu_down`` answers 503 to GPU reads.
    """

    def __init__(
        self,
        num_gpus: int = 1,
        clock: Callable[[], float] = time.monotonic,
        supported_clocks_mhz: tuple[int, ...] = H100_LIKE_CLOCKS_MHZ,
    ) -> None:
        super().__init__()
        self.vllm = VllmState()
        self.gpus = [FakeGpu(i, supported_clocks_mhz=supported_clocks_mhz) for i in range(num_gpus)]
        self.clock = clock
        self._last_s = clock()
        self.deny_control = False
        self.gpu_down = False
        self.clock_writes: list[tuple[tuple[int, ...], int]] = []
        self.resets: list[tuple[int, ...]] = []
        self.metrics_requests = 0
        self.hung_requests = 0
        self._release = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get(SIM_GPU_PREFIX, self._gpu_states)
        app.router.add_post(SIM_GPU_PREFIX + "/locked-clocks", self._lock)
        app.router.add_post(SIM_GPU_PREFIX + "/reset", self._reset)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_shutdown(self, _app: web.Application) -> None:
        self._release.set()

    def release_hangs(self) -> None:
        self._release.set()

    def _tick(self) -> None:
        now = self.clock()
        for g in self.gpus:
            g.advance(now - self._last_s)
        self._last_s = now

    async def _metrics(self, _req: web.Request) -> web.StreamResponse:
        self.metrics_requests += 1
        mode = self.vllm.mode
        if mode == "hang":
            self.hung_requests += 1
            self._signal()
            await self._release.wait()
            return web.Response(status=503)
        if mode == "down":
            return web.Response(status=503, text="engine dead")
        if mode == "malformed":
            return web.Response(text='vllm:kv_cache_usage_perc{engine="0" 0.5 oops\n')
        if mode == "disabled":
            return web.Response(text=_PROCESS_ONLY)
        if mode == "nan":  # well-formed text, values no controller can use
            lines = vllm_metrics_text(self.vllm).splitlines()
            bad = [ln.rsplit(" ", 1)[0] + " NaN" if "usage_perc{" in ln else ln for ln in lines]
            return web.Response(text="\n".join(bad) + "\n")
        return web.Response(text=vllm_metrics_text(self.vllm))

    async def _gpu_states(self, _req: web.Request) -> web.Response:
        if self.gpu_down:
            return web.Response(status=503, text="simulated GPU unavailable")
        self._tick()
        return web.json_response({"gpus": [g.state().to_json() for g in self.gpus]})

    def _pick(self, body: dict[str, Any]) -> list[FakeGpu]:
        wanted = set(body.get("gpus", []))
        return [g for g in self.gpus if g.index in wanted]

    async def _lock(self, req: web.Request) -> web.Response:
        if self.deny_control:
            return web.Response(status=403, text="Insufficient Permissions")
        body = await req.json()
        mhz = int(body["max_mhz"])
        picked = self._pick(body)
        if any(mhz not in g.supported_clocks_mhz for g in picked) or body["min_mhz"] != mhz:
            return web.Response(status=400, text=f"unsupported clock {mhz}")
        self._tick()
        for g in picked:
            g.locked_mhz = mhz
        self.clock_writes.append((tuple(g.index for g in picked), mhz))
        self._signal()
        return web.json_response({"ok": True})

    async def _reset(self, req: web.Request) -> web.Response:
        if self.deny_control:
            return web.Response(status=403, text="Insufficient Permissions")
        picked = self._pick(await req.json())
        self._tick()
        for g in picked:
            g.locked_mhz = None
        self.resets.append(tuple(g.index for g in picked))
        self._signal()
        return web.json_response({"ok": True})


@dataclass
class FakeRouter(_Served):
    """The router's ``/kairos/v1/instances/{name}/state|decision`` endpoints.

    Applies decisions like the real contract: only strictly newer
    ``(daemon_start_unix_s, epoch)`` keys, and only agents still pending.
    ``down`` answers 503 to everything. ``clock_cap_mhz`` / ``budget_conflict``
    are put in every applied decision's ack, as a router with a fleet budget does.
    ``wire_version``: the version the fake speaks; another than the daemon's makes
    it refuse decisions with HTTP 400 and answer state of that version, as a router
    of another release does.
    ``standby_of`` makes it a pair's standby: the ``not_leader`` 503 to everything,
    with ``X-Kairos-Leader`` naming that URL when it is not empty. ``calls``
    counts the requests it got.
    """

    instance: str = "gpu0"
    clock: Callable[[], float] = time.monotonic
    ongoing: list[AgentView] = field(default_factory=list)
    pending: list[AgentView] = field(default_factory=list)
    capacity_tokens: int | None = None
    down: bool = False
    decisions: list[AdmissionDecision] = field(default_factory=list)
    acks: list[DecisionAck] = field(default_factory=list)
    clock_cap_mhz: int | None = None
    budget_conflict: bool = False
    wire_version: int = WIRE_VERSION
    standby_of: str | None = None
    calls: int = 0

    def __post_init__(self) -> None:
        _Served.__init__(self)
        self._last_key: tuple[float, int] | None = None

    def _unavailable(self) -> web.Response | None:
        """The answer of a router that cannot serve now (down, or a standby), else None."""
        self.calls += 1
        if self.standby_of is not None:
            status, headers, body = not_leader_reply(self.standby_of)
            return web.json_response(body, status=status, headers=headers)
        return web.Response(status=503) if self.down else None

    def app(self) -> web.Application:
        app = web.Application()
        base = f"{API_PREFIX}/instances/{{name}}"
        app.router.add_get(base + "/state", self._state)
        app.router.add_post(base + "/decision", self._decision)
        return app

    def state(self) -> InstanceState:
        return InstanceState(
            instance=self.instance,
            now_s=self.clock(),
            ongoing=tuple(self.ongoing),
            pending=tuple(self.pending),
            capacity_tokens=self.capacity_tokens,
        )

    async def _state(self, req: web.Request) -> web.Response:
        if (refused := self._unavailable()) is not None:
            return refused
        if req.match_info["name"] != self.instance:
            return web.json_response({"error": "unknown instance"}, status=404)
        return web.json_response({**self.state().to_json(), "version": self.wire_version})

    async def _decision(self, req: web.Request) -> web.Response:
        if (refused := self._unavailable()) is not None:
            return refused
        body = await req.json()
        if self.wire_version != WIRE_VERSION:
            message = (
                f"wire version {body.get('version')} is not supported: this side speaks "
                f"version {self.wire_version} (upgrade the router, kairosd and id-tracker together)"
            )
            error = {"message": message, "code": "unsupported_wire_version"}
            return web.json_response({"error": error}, status=400)
        decision = AdmissionDecision.from_json(body)
        self.decisions.append(decision)
        if self._last_key is not None and decision.order_key <= self._last_key:
            ack = DecisionAck(accepted=False, reason="stale or duplicate")
        else:
            self._last_key = decision.order_key
            admitted = [a for a in self.pending if a.agent_id in set(decision.admission.admit)]
            self.pending = [a for a in self.pending if a not in admitted]
            self.ongoing.extend(admitted)
            ack = DecisionAck(
                accepted=True,
                admitted=tuple(a.agent_id for a in admitted),
                clock_cap_mhz=self.clock_cap_mhz,
                budget_conflict=self.budget_conflict,
            )
        self.acks.append(ack)
        self._signal()
        return web.json_response(ack.to_json())


class FakeZeusGpus:
    """Implements the slice of Zeus's ``GPUs`` that the zeus backend uses.

    Inject it into :class:`kairosd.gpu.zeus_backend.ZeusBackend` to exercise the
    real backend (threads, timeouts, error translation) without a GPU.
    ``write_error`` is raised by clock writes (e.g. Zeus's permission error);
    ``hang`` blocks every call until it is set (a wedged NVML driver).
    """

    def __init__(
        self, num_gpus: int = 1, supported_clocks_mhz: tuple[int, ...] = H100_LIKE_CLOCKS_MHZ
    ) -> None:
        self._n = num_gpus
        self.supported = supported_clocks_mhz
        self.locked: dict[int, int | None] = dict.fromkeys(range(num_gpus))
        self.energy_mj = dict.fromkeys(range(num_gpus), 0)
        self.write_error: BaseException | None = None
        self.hang: threading.Event | None = None
        self.calls: list[tuple[str, int]] = []

    def __len__(self) -> int:
        return self._n

    @property
    def gpus(self) -> list[object]:
        return [object() for _ in range(self._n)]  # no NVML handle: clock reads as None

    def _enter(self, name: str, i: int) -> None:
        self.calls.append((name, i))
        if self.hang is not None:
            self.hang.wait(timeout=30.0)

    def get_name(self, gpu_index: int) -> str:
        return "Fake Zeus GPU"

    def get_supported_memory_clocks(self, gpu_index: int) -> list[int]:
        return [1593, 2619]  # H100 SXM lists its HBM clock(s); the top one is the running one

    def get_supported_graphics_clocks(
        self, gpu_index: int, memory_clock_mhz: int | None = None
    ) -> list[int]:
        self._enter("supported", gpu_index)
        if memory_clock_mhz is None:
            # As Zeus 0.16 on a real H200 did: it hands None on to NVML's c_uint.
            raise TypeError("'NoneType' object cannot be interpreted as an integer")
        return list(reversed(self.supported))  # NVML lists clocks descending

    def set_gpu_locked_clocks(self, gpu_index: int, min_clock_mhz: int, max_clock_mhz: int) -> None:
        self._enter("set", gpu_index)
        if self.write_error is not None:
            raise self.write_error
        self.locked[gpu_index] = max_clock_mhz

    def reset_gpu_locked_clocks(self, gpu_index: int) -> None:
        self._enter("reset", gpu_index)
        if self.write_error is not None:
            raise self.write_error
        self.locked[gpu_index] = None

    def supports_get_total_energy_consumption(self, gpu_index: int) -> bool:
        return True

    def get_total_energy_consumption(self, gpu_index: int) -> int:
        self.energy_mj[gpu_index] += 1000
        return self.energy_mj[gpu_index]

    def get_instant_power_usage(self, gpu_index: int) -> int:
        return 250_000
