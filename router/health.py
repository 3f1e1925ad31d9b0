"""Active health checks and capacity discovery for every instance.

Each round GETs ``/health`` of every instance concurrently (bounded by
``health_timeout_s``); ``unhealthy_after_failures`` consecutive failures mark an
instance unhealthy and its agents are moved (:meth:`RouterCore.mark_health`, reached
through the :class:`router.ports.HealthSink` it is handed). One
success marks it healthy again. A probe that times out while the instance keeps
answering proxied requests is logged and not counted: busy is not down (a refused
connection or an error status still counts). ``/metrics`` is scraped when the capacity is not
known yet and every ``metrics_interval_s`` after that, for ``U_max`` from
``vllm:cache_config_info`` (parsed by :mod:`kairos_common.vllm_metrics`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import structlog

from kairos_common.vllm_metrics import MetricsParseError, parse_vllm_metrics
from router.config import TimeoutSettings
from router.instances import Instance, InstancePool
from router.ports import HealthSink, Pump

log = structlog.get_logger("kairos.router.health")


class HealthChecker:
    """Handed the pool it checks, where health observations go, the hold-queue pump
    (a learned capacity may admit held agents), a clock and its timeouts."""

    def __init__(
        self,
        pool: InstancePool,
        sink: HealthSink,
        pump: Pump,
        clock: Callable[[], float],
        timeouts: TimeoutSettings,
        session: Callable[[], aiohttp.ClientSession],
    ) -> None:
        self._pool = pool
        self._sink = sink
        self._pump = pump
        self._clock = clock
        self._timeouts = timeouts
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeouts.health_timeout_s)
        self._last_metrics_s: dict[str, float] = {}
        self._bad_metrics: set[str] = set()
        self._failed: set[str] = set()
        self._warned_models: tuple[tuple[str, tuple[str, ...]], ...] = ()

    async def check_once(self) -> None:
        """One round over all instances (also what tests call instead of waiting).

        One instance's failure, whatever it is, never stops the others' checks nor
        the loop: it is logged once (until that instance's check works again).
        """
        await asyncio.gather(*(self._guarded(inst) for inst in self._pool))

    async def _guarded(self, inst: Instance) -> None:
        try:
            await self._check(inst)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if inst.name not in self._failed:
                log.error("health_check_error", instance=inst.name, error=repr(exc)[:300])
                self._failed.add(inst.name)
            return
        self._failed.discard(inst.name)

    async def _check(self, inst: Instance) -> None:
        ok = False
        try:
            async with self._session().get(inst.base_url + "/health", timeout=self._timeout) as r:
                ok = r.status == 200
        except TimeoutError:
            if self._answering(inst):
                # Busy, not down: a CPU-bound engine (or a GPU host under load) can
                # answer the probe late while it keeps answering requests. Marking it
                # unhealthy would turn its agents' requests into 503s.
                log.info("health_probe_late", instance=inst.name,
                         timeout_s=self._timeouts.health_timeout_s)  # fmt: skip
                return
            ok = False
        except aiohttp.ClientError:
            ok = False
        if self._pool.get(inst.name) is not inst:
            return  # removed while we were checking
        self._sink.mark_health(inst, ok)
        if ok and self._metrics_due(inst):
            await self.scrape_metrics(inst)

    def _answering(self, inst: Instance) -> bool:
        """Did ``inst`` answer a proxied request within the window in which
        ``unhealthy_after_failures`` probes would have failed?"""
        last = inst.last_answered_s
        t = self._timeouts
        window_s = t.unhealthy_after_failures * (t.health_interval_s + t.health_timeout_s)
        return last is not None and self._clock() - last <= window_s

    def _metrics_due(self, inst: Instance) -> bool:
        if inst.metrics_capacity_tokens is None and inst.metrics_enabled is not False:
            return True
        last = self._last_metrics_s.get(inst.name)
        interval = self._timeouts.metrics_interval_s
        return last is None or self._clock() - last >= interval

    async def scrape_metrics(self, inst: Instance) -> None:
        """Learn ``U_max`` from the backend's ``/metrics``; absence is logged once."""
        self._last_metrics_s[inst.name] = self._clock()
        try:
            async with self._session().get(inst.base_url + "/metrics", timeout=self._timeout) as r:
                if r.status != 200:
                    return
                text = await r.text()
            parsed = parse_vllm_metrics(text)
        except MetricsParseError as exc:
            # Bad input (e.g. NaN): what it said about capacity is stale now.
            inst.metrics_capacity_tokens = None
            if inst.name not in self._bad_metrics:
                self._bad_metrics.add(inst.name)
                log.warning(
                    "bad_backend_metrics",
                    instance=inst.name,
                    error=str(exc)[:300],
                    hint="ignoring this backend's /metrics until they parse again",
                )
            return
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as exc:
            log.warning("metrics_scrape_failed", instance=inst.name, error=str(exc))
            return
        self._bad_metrics.discard(inst.name)
        if not parsed.metrics_enabled and inst.metrics_enabled is not False:
            log.warning(
                "vllm_metrics_disabled",
                instance=inst.name,
                hint="vLLM runs with --disable-log-stats; set admission.capacity_tokens",
            )
        inst.metrics_enabled = parsed.metrics_enabled
        if parsed.model_names and parsed.model_names != inst.served_models:
            inst.served_models = parsed.model_names
            self._check_models()
        learned = parsed.capacity_tokens
        if learned and learned != inst.metrics_capacity_tokens:
            inst.metrics_capacity_tokens = learned
            log.info("instance_capacity", instance=inst.name, capacity_tokens=learned)
            self._pump(inst)

    def _check_models(self) -> None:
        """Warn, once per combination, when the instances serve different models.

        Placement and admission weigh contexts, not model names: an agent placed on
        an instance that does not serve its model gets vLLM's 404. One router
        fronts one model (docs/router.md).
        """
        served = {i.name: i.served_models for i in self._pool if i.served_models}
        if len(set(served.values())) <= 1:
            self._warned_models = ()  # agreeing (again): a later mix is warned anew
        else:
            key = tuple(sorted(served.items()))
            if key != self._warned_models:
                self._warned_models = key
                log.warning(
                    "backends_serve_different_models",
                    models={name: list(m) for name, m in served.items()},
                    hint="one router fronts one model: run a router per model",
                )

    async def run(self) -> None:
        interval = self._timeouts.health_interval_s
        while True:
            try:
                await self.check_once()
            except Exception:  # defence in depth: the loop itself must never die
                log.exception("health_round_failed")
            await asyncio.sleep(interval)
