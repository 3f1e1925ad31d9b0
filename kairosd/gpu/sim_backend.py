"""``sim`` backend: an HTTP client of the simulated GPU (kairos_common.simgpu).

The simulated GPU lives on the fake vLLM server's base URL, so the whole daemon
(clocks, energy counter, power) runs on a CPU-only machine exactly as it would
on an H100, only the numbers come from the simulator's power model.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from kairos_common.errors import WireFormatError
from kairos_common.simgpu import SIM_GPU_PREFIX, SimGpuState
from kairosd.errors import GpuError, GpuPermissionError, GpuTimeoutError, GpuUnavailableError
from kairosd.gpu.base import GpuStatus, common_clocks


class SimBackend:
    """Control GPUs ``gpu_indices`` of the simulated GPU at ``base_url``."""

    name = "sim"

    def __init__(
        self,
        base_url: str,
        gpu_indices: tuple[int, ...],
        session: aiohttp.ClientSession,
        timeout_s: float = 2.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.gpu_indices = gpu_indices
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    @property
    def controls(self) -> bool:
        return True

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        url = f"{self.base_url}{SIM_GPU_PREFIX}{path}"
        try:
            async with self._session.request(method, url, json=body, timeout=self._timeout) as resp:
                text = await resp.text()
                if resp.status == 403:
                    raise GpuPermissionError(f"simulated GPU refused {path}: {text}")
                if resp.status >= 400:
                    raise GpuError(f"simulated GPU {method} {path} -> {resp.status}: {text}")
                return await resp.json(content_type=None)
        except TimeoutError as exc:
            raise GpuTimeoutError(f"simulated GPU {method} {path} timed out") from exc
        except (aiohttp.ClientError, ValueError) as exc:
            raise GpuUnavailableError(f"simulated GPU at {self.base_url}: {exc}") from exc

    async def status(self) -> list[GpuStatus]:
        data = await self._call("GET", "")
        try:
            states = {s.index: s for s in (SimGpuState.from_json(g) for g in data["gpus"])}
        except (KeyError, TypeError, WireFormatError) as exc:
            raise GpuError(f"malformed simulated GPU answer: {exc}") from exc
        missing = [i for i in self.gpu_indices if i not in states]
        if missing:
            raise GpuUnavailableError(f"simulated GPU has no GPU(s) {missing}")
        return [_to_status(states[i]) for i in self.gpu_indices]

    async def all_indices(self) -> tuple[int, ...]:
        """Every GPU the simulated host has (for ``kairosd gpus`` / ``reset``)."""
        data = await self._call("GET", "")
        try:
            return tuple(sorted(int(g["index"]) for g in data["gpus"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise GpuError(f"malformed simulated GPU answer: {exc}") from exc

    async def supported_clocks_mhz(self) -> tuple[int, ...]:
        return common_clocks(await self.status())

    async def set_locked_clock(self, clock_mhz: int) -> None:
        body = {"gpus": list(self.gpu_indices), "min_mhz": clock_mhz, "max_mhz": clock_mhz}
        await self._call("POST", "/locked-clocks", body)

    async def reset_clocks(self) -> None:
        await self._call("POST", "/reset", {"gpus": list(self.gpu_indices)})

    async def close(self) -> None:
        await asyncio.sleep(0)


def _to_status(s: SimGpuState) -> GpuStatus:
    locked = s.locked_max_mhz if s.locked_min_mhz == s.locked_max_mhz else None
    return GpuStatus(
        index=s.index,
        name=s.name,
        supported_clocks_mhz=s.supported_clocks_mhz,
        current_clock_mhz=s.current_clock_mhz,
        energy_mj=s.energy_mj,
        power_w=s.power_w,
        locked_clock_mhz=locked,
    )
