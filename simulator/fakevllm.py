"""A fake vLLM OpenAI server whose timing and power come from the simulator.

Serves vLLM's HTTP surface — ``/v1/chat/completions`` and ``/v1/completions``
(streaming SSE with ``stream_options.include_usage`` as vLLM does, and not),
``/v1/models``, ``/health``, ``/metrics`` with vLLM's metric names and labels —
plus the simulated-GPU endpoints of :mod:`kairos_common.simgpu` that
``kairosd --gpu-backend sim`` controls. Requests run on the simulator's engine
model in scaled real time (:class:`~simulator.realtime.RealtimeEngine`), so
latency, batching, KV pressure, preemption and power all behave like the model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kairos_common.simgpu import SIM_GPU_PREFIX
from simulator import openai_format as fmt
from simulator.engine import Engine
from simulator.engine_types import (
    EngineEvent,
    FirstToken,
    RequestFinished,
    RequestRejected,
    TokenProgress,
)
from simulator.gpu import SimulatedGpu
from simulator.power import PowerModel
from simulator.presets import DEFAULT_MODEL as DEFAULT_MODEL
from simulator.presets import Preset, get_preset, with_kv_offload
from simulator.realtime import RealtimeEngine
from simulator.timing import TimingModel

log = structlog.get_logger(__name__)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(frozen=True, slots=True)
class FakeVllmConfig:
    """Options of ``kairos fake-vllm`` (mirroring ``vllm serve`` where one exists)."""

    model: str = DEFAULT_MODEL
    preset: str = "h100-nvl-qwen3-30b"
    speedup: float = 1.0
    api_key: str | None = None
    enable_prompt_tokens_details: bool = False
    disable_log_stats: bool = False
    stream_tick_s: float = 0.05
    kv_capacity_tokens: int | None = None
    """Override the preset's KV capacity (small caches reach pressure quickly)."""
    kv_offloading_size_gib: float = 0.0
    """vLLM's ``--kv-offloading-size``: a CPU KV tier of this many GiB (0: none)."""


class FakeVllm:
    """State of one fake vLLM instance: the engine, prefix index and metrics."""

    def __init__(
        self,
        config: FakeVllmConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        preset: Preset | None = None,
    ) -> None:
        self.config = config
        self.preset = preset or get_preset(config.preset)
        if config.kv_capacity_tokens is not None:
            engine_params = dataclasses.replace(
                self.preset.engine, kv_capacity_tokens=config.kv_capacity_tokens
            )
            self.preset = dataclasses.replace(self.preset, engine=engine_params)
        self.preset = with_kv_offload(
            self.preset, config.kv_offloading_size_gib, "--kv-offloading-size"
        )
        p = self.preset
        gpu = SimulatedGpu(p.gpu)
        engine = Engine(
            p.engine, TimingModel(p.timing), PowerModel(p.power), gpu, emit_progress=True
        )
        self.rt = RealtimeEngine(
            engine, speedup=config.speedup, clock=clock, stream_tick_s=config.stream_tick_s
        )
        self.prefix = fmt.PrefixIndex()
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency.",
            labels,
            registry=self.registry,
            buckets=(0.3, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320),
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
            labels,
            registry=self.registry,
            buckets=(0.01, 0.04, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40),
        )
        self.registry.register(_EngineCollector(self))

    @property
    def engine(self) -> Engine:
        return self.rt.engine

    def labels(self) -> dict[str, str]:
        return {"model_name": self.config.model, "engine": "0"}


FAKE_KEY: web.AppKey[FakeVllm] = web.AppKey("fake", FakeVllm)


class _EngineCollector(Collector):
    """Exports the engine's gauges and counters under vLLM's names."""

    def __init__(self, fake: FakeVllm) -> None:
        self.fake = fake

    def collect(self) -> list[Metric]:
        f = self.fake
        eng = f.engine
        names, values = ["model_name", "engine"], [f.config.model, "0"]
        out: list[Metric] = []

        def gauge(name: str, doc: str, value: float) -> None:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            out.append(g)

        def counter(name: str, doc: str, value: float) -> None:
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(values, value)
            out.append(c)

        gauge("vllm:num_requests_running", "Requests in model execution batches.", len(eng.running))
        gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", len(eng.waiting))
        gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            eng.kv_usage_fraction(),
        )
        c = eng.counters
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", c.prompt_tokens)
        counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", c.generation_tokens
        )
        counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of tokens.",
            c.prefix_queried_tokens,
        )
        counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of tokens.",
            c.prefill_reused_tokens,
        )
        counter("vllm:num_preemptions", "Cumulative number of preemptions.", c.preemptions)
        # Not a vLLM metric: the fake's own self-check of its time acceleration.
        gauge(
            "kairos_fake_step_lag_max_seconds",
            "Largest real delay of a timed engine step behind its due time.",
            f.rt.max_step_lag_s,
        )
        counter(
            "vllm:request_success", "Count of successfully processed requests.", c.finished_requests
        )
        p = f.preset.engine
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[
                "block_size",
                "cache_dtype",
                "enable_prefix_caching",
                "num_gpu_blocks",
                "kv_cache_size_tokens",
                "gpu_memory_utilization",
                "kv_offloading_size",
                "kv_offloading_backend",
            ],
        )
        blocks = eng.capacity_tokens // p.block_size
        gib = f.config.kv_offloading_size_gib
        info.add_metric(
            [
                str(p.block_size),
                "auto",
                "True",
                str(blocks),
                str(eng.capacity_tokens),
                "0.9",
                str(gib) if gib else "None",  # vLLM's str() of an unset size
                "native",
            ],
            1.0,
        )
        out.append(info)
        return out


# ------------------------------------------------------------------ handlers
def _error(message: str, status: int, err_type: str = "BadRequestError") -> web.Response:
    return web.json_response(fmt.error_body(message, err_type, status), status=status)


@web.middleware
async def _auth_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """``vllm serve --api-key``: Bearer auth on ``/v1/*`` only."""
    fake: FakeVllm = request.app[FAKE_KEY]
    key = fake.config.api_key
    authorized = request.headers.get("Authorization", "") == f"Bearer {key}"
    if key and request.path.startswith("/v1/") and not authorized:
        return web.json_response({"error": "Unauthorized"}, status=401)
    result: web.StreamResponse = await handler(request)
    return result


async def _read_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise fmt.BadRequest("request body is not valid JSON") from None


def _check_model(fake: FakeVllm, body: dict[str, Any]) -> web.Response | None:
    model = body.get("model")
    if model is not None and model != fake.config.model:
        return _error(f"The model `{model}` does not exist.", 404, "NotFoundError")
    return None


async def _completion(request: web.Request, *, chat: bool) -> web.StreamResponse:
    fake: FakeVllm = request.app[FAKE_KEY]
    try:
        body = await _read_body(request)
        parsed = fmt.parse_request(body, chat=chat)
    except fmt.BadRequest as exc:
        return _error(str(exc), 400)
    bad_model = _check_model(fake, body)
    if bad_model is not None:
        return bad_model
    prefix = "chatcmpl" if chat else "cmpl"
    rid = request.headers.get("X-Request-Id") or f"{prefix}-{uuid.uuid4().hex}"
    shared = fake.prefix.shared_prefix(parsed)
    queue = fake.rt.submit(
        rid,
        prompt_tokens=parsed.prompt_tokens,
        output_tokens=parsed.output_tokens,
        cache_key=parsed.cache_key,
        shared_prefix_tokens=shared,
    )
    if not queue.empty():
        first = queue.get_nowait()
        if isinstance(first, RequestRejected):
            fake.rt.finish(rid)
            return _error(f"This model's maximum context length is exceeded: {first.reason}", 400)
        queue.put_nowait(first)
    try:
        if parsed.stream:
            return await _stream(request, fake, rid, parsed, queue, chat=chat)
        return await _unary(fake, rid, parsed, queue, chat=chat)
    except (asyncio.CancelledError, ConnectionResetError):
        fake.rt.abort(rid)
        raise


def _finished(fake: FakeVllm, parsed: fmt.ParsedPrompt, done: RequestFinished) -> dict[str, Any]:
    lat = fake.rt.to_real_s
    fake.e2e.labels(**fake.labels()).observe(lat(done.t_s - done.arrival_s))
    fake.ttft.labels(**fake.labels()).observe(lat(done.first_token_s - done.arrival_s))
    cached = done.cached_tokens if fake.config.enable_prompt_tokens_details else None
    fake.prefix.record_output(parsed.cache_key, fmt.filler(done.output_tokens))
    return fmt.usage_obj(done.prompt_tokens, done.output_tokens, cached)


async def _unary(
    fake: FakeVllm,
    rid: str,
    parsed: fmt.ParsedPrompt,
    queue: asyncio.Queue[EngineEvent],
    *,
    chat: bool,
) -> web.Response:
    while True:
        event = await queue.get()
        if isinstance(event, RequestFinished):
            break
    usage = _finished(fake, parsed, event)
    text = fmt.filler(event.output_tokens)
    reason = fmt.finish_reason(parsed, event.output_tokens)
    make = fmt.chat_response if chat else fmt.completion_response
    resp = make(rid, fake.config.model, text, reason, usage)
    return web.json_response(resp, headers={"X-Request-Id": rid})


async def _send(resp: web.StreamResponse, obj: dict[str, Any] | str) -> None:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    await resp.write(f"data: {data}\n\n".encode())


async def _stream(
    request: web.Request,
    fake: FakeVllm,
    rid: str,
    parsed: fmt.ParsedPrompt,
    queue: asyncio.Queue[EngineEvent],
    *,
    chat: bool,
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={**SSE_HEADERS, "X-Request-Id": rid})
    await resp.prepare(request)
    model = fake.config.model
    sent = 0
    started = False
    while True:
        event = await queue.get()
        if isinstance(event, FirstToken | TokenProgress | RequestFinished):
            if chat and not started:
                await _send(
                    resp, fmt.chunk(rid, model, chat=True, text=None, reason=None, first=True)
                )
            started = True
        if isinstance(event, TokenProgress):
            new = event.generated_tokens - sent
            if new > 0:
                await _send(
                    resp, fmt.chunk(rid, model, chat=chat, text=fmt.filler(new), reason=None)
                )
                sent = event.generated_tokens
        elif isinstance(event, RequestFinished):
            usage = _finished(fake, parsed, event)
            rest = event.output_tokens - sent
            reason = fmt.finish_reason(parsed, event.output_tokens)
            await _send(
                resp, fmt.chunk(rid, model, chat=chat, text=fmt.filler(max(rest, 0)), reason=reason)
            )
            if parsed.include_usage:
                await _send(resp, fmt.usage_chunk(rid, model, chat=chat, usage=usage))
            await _send(resp, "[DONE]")
            break
    await resp.write_eof()
    return resp


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=False)


async def models(request: web.Request) -> web.Response:
    fake: FakeVllm = request.app[FAKE_KEY]
    m = fake.config.model
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": m,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": m,
                    "parent": None,
                    "max_model_len": fake.preset.engine.max_model_len,
                }
            ],
        }
    )


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    fake: FakeVllm = request.app[FAKE_KEY]
    fake.rt.sync()
    if fake.config.disable_log_stats:
        return web.Response(body=b"# vLLM stats logging disabled\n", content_type="text/plain")
    return web.Response(
        body=generate_latest(fake.registry), content_type="text/plain", charset="utf-8"
    )


# ------------------------------------------------------------- simulated GPU
async def gpus(request: web.Request) -> web.Response:
    fake: FakeVllm = request.app[FAKE_KEY]
    now = fake.rt.sync()
    state = fake.engine.gpu.state(now)
    # With --speedup S one real second holds S simulated seconds. The counter
    # advances by (simulated energy) / S so that energy differenced over real
    # time gives the simulated GPU's power in watts, which is what the daemon
    # measures and reports.
    energy_mj = int(fake.engine.energy_j_at(now) * 1000.0 / fake.config.speedup)
    obj = state.to_json() | {"energy_mj": energy_mj}
    return web.json_response({"gpus": [obj]})


def _gpu_indices(body: Any) -> list[int]:
    if not isinstance(body, dict):
        raise fmt.BadRequest("body must be an object")
    ids = body.get("gpus", [0])
    if not isinstance(ids, list) or any(i != 0 for i in ids):
        raise fmt.BadRequest("this fake vLLM instance hosts one GPU, index 0")
    return ids


async def lock_clocks(request: web.Request) -> web.Response:
    fake: FakeVllm = request.app[FAKE_KEY]
    try:
        body = await _read_body(request)
        _gpu_indices(body)
        lo, hi = body.get("min_mhz"), body.get("max_mhz")
        if not isinstance(lo, int) or not isinstance(hi, int):
            raise fmt.BadRequest("min_mhz and max_mhz must be integers")
        fake.rt.set_locked_clocks(lo, hi)
    except (fmt.BadRequest, ValueError) as exc:
        return _error(str(exc), 400)
    log.info("sim_gpu_locked", min_mhz=lo, max_mhz=hi)
    return web.json_response({"ok": True})


async def reset_clocks(request: web.Request) -> web.Response:
    fake: FakeVllm = request.app[FAKE_KEY]
    try:
        _gpu_indices(await _read_body(request))
    except fmt.BadRequest as exc:
        return _error(str(exc), 400)
    fake.rt.reset_clocks()
    log.info("sim_gpu_reset")
    return web.json_response({"ok": True})


async def _not_found(request: web.Request) -> web.Response:
    return _error(f"Not Found: {request.path}", 404, "NotFoundError")


def make_app(fake: FakeVllm) -> web.Application:
    """The aiohttp application of one fake vLLM instance."""
    app = web.Application(middlewares=[_auth_middleware], client_max_size=256 * 1024**2)
    app[FAKE_KEY] = fake
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get(SIM_GPU_PREFIX, gpus)
    app.router.add_post(f"{SIM_GPU_PREFIX}/locked-clocks", lock_clocks)
    app.router.add_post(f"{SIM_GPU_PREFIX}/reset", reset_clocks)
    app.router.add_route("*", "/{tail:.*}", _not_found)

    async def _start(_: web.Application) -> None:
        fake.rt.start()

    async def _stop(_: web.Application) -> None:
        await fake.rt.stop()

    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
    return app
