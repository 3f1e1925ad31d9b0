"""Opening the backend named in the configuration: ``zeus``, ``sim`` or ``observe``.

Kept apart from :mod:`kairosd.startup` (which also builds controllers and
loads numpy) so ``kairosd reset`` and ``kairosd gpus`` import only what a
backend needs: systemd's ExecStopPost runs ``kairosd reset`` after a crash,
and every second it spends importing is a second at a low clock.
"""

from __future__ import annotations

import aiohttp

from kairosd.gpu.base import GpuBackend
from kairosd.gpu.observe import ObserveBackend
from kairosd.gpu.sim_backend import SimBackend

BACKENDS = ("zeus", "sim", "observe")


async def open_backend(
    kind: str,
    *,
    vllm_url: str,
    gpus: tuple[int, ...] | None,
    timeout_s: float,
    session: aiohttp.ClientSession,
) -> GpuBackend:
    """Build the backend named ``kind`` (``zeus``, ``sim`` or ``observe``).

    ``observe`` reads the real GPUs through Zeus and never writes. Zeus is
    imported only here, only when asked for, so CPU-only hosts never load it.
    """
    if kind == "sim":
        return SimBackend(vllm_url, gpus if gpus is not None else (0,), session, timeout_s)
    from kairosd.gpu.zeus_backend import ZeusBackend

    backend = await ZeusBackend.open(gpus, timeout_s)
    return ObserveBackend(backend) if kind == "observe" else backend
