"""HTTP contract of the simulated GPU hosted by the fake vLLM server.

``kairosd --gpu-backend sim`` controls the simulated GPU(s) of a fake vLLM
instance through these endpoints on the *same base URL* as the fake vLLM server
(the daemon's ``--vllm-url``), so a whole CPU-only deployment needs no extra
ports. Real vLLM servers do not have them.

======  ==============================  ==============================================
method  path                            body → response
======  ==============================  ==============================================
GET     /kairos-sim/gpus                → ``{"gpus": [GpuState...]}``
POST    /kairos-sim/gpus/locked-clocks  ``{"gpus": [0], "min_mhz": f, "max_mhz": f}`` → ok
POST    /kairos-sim/gpus/reset          ``{"gpus": [0]}`` → ``{"ok": true}``
======  ==============================  ==============================================

``GpuState`` (see :class:`SimGpuState`): ``index``, ``name``,
``supported_clocks_mhz`` (ascending), ``locked_min_mhz``/``locked_max_mhz``
(null when unlocked), ``current_clock_mhz``, ``energy_mj`` (cumulative counter,
integer millijoules, like NVML's total energy), ``power_w`` (instant).
A clock request outside the supported range answers 400.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kairos_common.errors import WireFormatError

SIM_GPU_PREFIX = "/kairos-sim/gpus"


@dataclass(frozen=True, slots=True)
class SimGpuState:
    index: int
    name: str
    supported_clocks_mhz: tuple[int, ...]
    locked_min_mhz: int | None
    locked_max_mhz: int | None
    current_clock_mhz: int
    energy_mj: int
    power_w: float

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["supported_clocks_mhz"] = list(self.supported_clocks_mhz)
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> SimGpuState:
        try:
            return cls(
                index=int(obj["index"]),
                name=str(obj["name"]),
                supported_clocks_mhz=tuple(int(c) for c in obj["supported_clocks_mhz"]),
                locked_min_mhz=None
                if obj.get("locked_min_mhz") is None
                else int(obj["locked_min_mhz"]),
                locked_max_mhz=None
                if obj.get("locked_max_mhz") is None
                else int(obj["locked_max_mhz"]),
                current_clock_mhz=int(obj["current_clock_mhz"]),
                energy_mj=int(obj["energy_mj"]),
                power_w=float(obj["power_w"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WireFormatError(f"malformed simulated GPU state: {exc}") from exc
