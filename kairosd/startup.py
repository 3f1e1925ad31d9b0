"""Start-up: open the configured GPU backend (:mod:`kairosd.gpu.opening`), reconcile
it, build levels and the controller. Kept apart from the loop."""

from __future__ import annotations

import structlog

from controllers.errors import UnknownPolicyError
from controllers.registry import levels_for, make_controller
from controllers.types import Controller
from kairos_common.cli import check_fixed_clock
from kairos_common.errors import ConfigError
from kairosd.config import KairosdConfig
from kairosd.errors import GpuPermissionError
from kairosd.gpu.base import GpuBackend
from kairosd.gpu.observe import ObserveBackend

log = structlog.get_logger()


async def prepare_backend(backend: GpuBackend, *, require_control: bool) -> GpuBackend:
    """Reconcile the GPUs' actual state and check that we may change clocks.

    A previous crash may have left clocks locked, so a controlling backend
    resets them first; that reset also proves we hold the privilege. Without it
    the daemon degrades to observe mode (still reporting power), unless the
    operator demanded control, in which case the permission error propagates.
    """
    for gpu in await backend.status():
        if gpu.locked_clock_mhz is not None:
            log.warning("gpu_found_locked", gpu=gpu.index, locked_clock_mhz=gpu.locked_clock_mhz)
    if not backend.controls:
        return backend
    try:
        await backend.reset_clocks()
    except GpuPermissionError as exc:
        if require_control:
            raise
        log.error("gpu_control_not_permitted", error=str(exc), fallback="observe mode")
        return ObserveBackend(backend, reason=str(exc))
    return backend


async def build_controller(backend: GpuBackend, config: KairosdConfig) -> Controller:
    """Frequency levels from the GPU's own clock list, then the named policy."""
    supported = await backend.supported_clocks_mhz()
    try:
        check_fixed_clock(config.policy, supported, f"GPU(s) {','.join(map(str, config.gpus))}")
    except ConfigError as exc:
        raise UnknownPolicyError(str(exc)) from None
    levels = levels_for(
        config.policy,
        supported,
        floor_mhz=config.floor_mhz,
        ceiling_mhz=config.ceiling_mhz,
        num_levels=config.num_levels,
    )
    log.info("frequency_levels", clocks_mhz=list(levels.clocks_mhz), policy=config.policy)
    return make_controller(config.policy, levels, config.kairos, speedup=config.sim_speedup)
