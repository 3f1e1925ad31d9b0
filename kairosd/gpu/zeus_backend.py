"""``zeus`` backend: real GPUs through Zeus (NVML directly as root, or zeusd).

The only module that imports Zeus/NVML. Zeus picks the privileged path itself:
when ``ZEUSD_SOCK_PATH`` (or ``ZEUSD_HOST_PORT``) is set, ``get_gpus()`` returns
GPUs whose clock setters go through the zeusd daemon; otherwise they call NVML
directly, which needs root / CAP_SYS_ADMIN. Reads (clocks, energy, power) work
unprivileged either way. Indices follow Zeus: they respect CUDA_VISIBLE_DEVICES.

Every vendor call runs in a daemon worker thread with a timeout, because NVML
calls block for 10–20 ms and occasionally hang; a daemon thread cannot keep
the process alive at exit when the driver is wedged. Vendor errors are
translated into :mod:`kairosd.errors` here and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import pynvml
from zeus.device.exception import ZeusdError
from zeus.device.gpu.common import (
    ZeusGPUDriverNotLoadedError,
    ZeusGPUInitError,
    ZeusGPULibraryNotFoundError,
    ZeusGPUNoPermissionError,
    ZeusGPUNotFoundError,
    ZeusGPUTimeoutError,
)
from zeus.exception import ZeusBaseError
from zeus.utils.zeusd import ZeusdAuthError, ZeusdCapabilityError, ZeusdConnectionError

from kairosd.errors import GpuError, GpuPermissionError, GpuTimeoutError, GpuUnavailableError
from kairosd.gpu.base import GpuStatus, common_clocks

T = TypeVar("T")
_MAX_IN_FLIGHT = 2


class ZeusGpus(Protocol):
    """The slice of ``zeus.device.gpu.GPUs`` this backend uses (fakes implement it)."""

    def __len__(self) -> int: ...
    @property
    def gpus(self) -> Sequence[Any]: ...
    def get_name(self, gpu_index: int) -> str: ...
    def get_supported_memory_clocks(self, gpu_index: int) -> list[int]: ...
    def get_supported_graphics_clocks(
        self, gpu_index: int, memory_clock_mhz: int | None = None
    ) -> list[int]: ...
    def set_gpu_locked_clocks(
        self, gpu_index: int, min_clock_mhz: int, max_clock_mhz: int
    ) -> None: ...
    def reset_gpu_locked_clocks(self, gpu_index: int) -> None: ...
    def supports_get_total_energy_consumption(self, gpu_index: int) -> bool: ...
    def get_total_energy_consumption(self, gpu_index: int) -> int: ...
    def get_instant_power_usage(self, gpu_index: int) -> int: ...


def translate_zeus_error(exc: BaseException) -> GpuError:
    """Map a Zeus/NVML/zeusd exception to the daemon's error vocabulary."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ZeusGPUNoPermissionError | ZeusdAuthError | ZeusdCapabilityError):
        return GpuPermissionError(text)
    if isinstance(exc, PermissionError):
        return GpuPermissionError(text)
    if isinstance(exc, ZeusdError) and any(
        w in str(exc).lower() for w in ("permission", "forbidden", "unauthorized")
    ):
        return GpuPermissionError(text)
    if isinstance(exc, ZeusdConnectionError):
        return GpuUnavailableError(f"{text} (check ZEUSD_SOCK_PATH and that zeusd runs)")
    if isinstance(
        exc,
        ZeusGPUInitError
        | ZeusGPUNotFoundError
        | ZeusGPULibraryNotFoundError
        | ZeusGPUDriverNotLoadedError,
    ):
        return GpuUnavailableError(text)
    if isinstance(exc, ZeusGPUTimeoutError):
        return GpuTimeoutError(text)
    return GpuError(text)


def load_zeus_gpus() -> ZeusGpus:
    """``zeus.device.get_gpus()`` (blocking: NVML init; call it off the loop)."""
    from zeus.device import get_gpus

    gpus: ZeusGpus = get_gpus()
    return gpus


class BlockingCaller:
    """Runs blocking vendor calls in daemon threads, each bounded by a timeout.

    At most ``max_in_flight`` calls may be outstanding: once NVML is wedged,
    later calls fail fast instead of piling up threads behind it.
    """

    def __init__(self, timeout_s: float, max_in_flight: int = _MAX_IN_FLIGHT) -> None:
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        self._in_flight = 0
        self._lock = threading.Lock()
        self._idle: asyncio.Event | None = None

    async def wait_idle(self) -> None:
        """Wait until no call is outstanding (e.g. after a wedged call returns)."""
        while True:
            with self._lock:
                if self._in_flight == 0:
                    return
                self._idle = asyncio.Event()
                idle = self._idle
            await idle.wait()

    def _became_idle(self) -> None:
        if self._idle is not None:
            self._idle.set()

    async def call(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._in_flight >= self.max_in_flight:
                raise GpuTimeoutError(
                    f"{self._in_flight} earlier GPU calls are still hung; not queueing more"
                )
            self._in_flight += 1
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def deliver(result: Any, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

        def target() -> None:
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn()
            except BaseException as exc:
                error = exc
            with self._lock:
                self._in_flight -= 1
                idle = self._in_flight == 0
            # RuntimeError: the loop already closed and nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(deliver, result, error)
                if idle:
                    loop.call_soon_threadsafe(self._became_idle)

        threading.Thread(target=target, name="kairosd-nvml", daemon=True).start()
        try:
            return await asyncio.wait_for(fut, self.timeout_s)
        except TimeoutError as exc:
            raise GpuTimeoutError(f"GPU call did not return within {self.timeout_s} s") from exc
        except (ZeusBaseError, PermissionError) as exc:
            raise translate_zeus_error(exc) from exc
        except (pynvml.NVMLError, TypeError, ValueError, OSError) as exc:
            # A vendor bug or an NVML error Zeus did not wrap: still the GPU's error.
            raise GpuError(f"GPU call failed: {type(exc).__name__}: {exc}") from exc


class ZeusBackend:
    """Lock/reset/read the GPUs ``gpu_indices`` of a Zeus ``GPUs`` object."""

    name = "zeus"

    def __init__(
        self, gpus: ZeusGpus, gpu_indices: tuple[int, ...], timeout_s: float = 2.0
    ) -> None:
        bad = [i for i in gpu_indices if not 0 <= i < len(gpus)]
        if bad:
            raise GpuUnavailableError(
                f"GPU index(es) {bad} not visible (Zeus sees {len(gpus)} GPU(s); "
                "indices follow CUDA_VISIBLE_DEVICES)"
            )
        self.gpu_indices = gpu_indices
        self._gpus = gpus
        self._caller = BlockingCaller(timeout_s)
        self._energy_ok: dict[int, bool] = {}
        self._clocks: dict[int, tuple[int, ...]] = {}

    @classmethod
    async def open(
        cls,
        gpu_indices: tuple[int, ...] | None,
        timeout_s: float = 2.0,
        loader: Callable[[], ZeusGpus] = load_zeus_gpus,
    ) -> ZeusBackend:
        """Initialise Zeus off the loop; ``None`` indices means every visible GPU."""
        gpus = await BlockingCaller(max(timeout_s, 30.0)).call(loader)
        indices = gpu_indices if gpu_indices is not None else tuple(range(len(gpus)))
        return cls(gpus, indices, timeout_s)

    @property
    def controls(self) -> bool:
        return True

    async def _call(self, fn: Callable[[], T]) -> T:
        return await self._caller.call(fn)

    async def wait_idle(self) -> None:
        """Until no NVML call is in flight (shutdown waits on this before resetting)."""
        await self._caller.wait_idle()

    def _read_one(self, i: int) -> GpuStatus:
        g = self._gpus
        if i not in self._energy_ok:
            self._energy_ok[i] = bool(g.supports_get_total_energy_consumption(i))
        if i not in self._clocks:  # fixed per GPU: read once, not every epoch
            self._clocks[i] = _graphics_clocks_mhz(g, i)
        energy = int(g.get_total_energy_consumption(i)) if self._energy_ok[i] else None
        return GpuStatus(
            index=i,
            name=str(g.get_name(i)),
            supported_clocks_mhz=self._clocks[i],
            current_clock_mhz=_current_clock_mhz(g.gpus[i]),
            energy_mj=energy,
            power_w=g.get_instant_power_usage(i) / 1000.0,
        )

    async def status(self) -> list[GpuStatus]:
        return await self._call(lambda: [self._read_one(i) for i in self.gpu_indices])

    async def supported_clocks_mhz(self) -> tuple[int, ...]:
        return common_clocks(await self.status())

    async def set_locked_clock(self, clock_mhz: int) -> None:
        def apply() -> None:
            for i in self.gpu_indices:
                self._gpus.set_gpu_locked_clocks(i, clock_mhz, clock_mhz)

        await self._call(apply)

    async def reset_clocks(self) -> None:
        def apply() -> None:
            for i in self.gpu_indices:
                self._gpus.reset_gpu_locked_clocks(i)

        await self._call(apply)

    async def close(self) -> None:
        await asyncio.sleep(0)


def _graphics_clocks_mhz(g: ZeusGpus, i: int) -> tuple[int, ...]:
    """Graphics clocks supported at the GPU's highest memory clock (the one it runs at).

    The memory clock must be named: Zeus 0.16 passes its default ``None`` on to
    NVML's ``c_uint`` and fails with a TypeError (seen on a real H200).
    """
    memory_mhz = max((int(c) for c in g.get_supported_memory_clocks(i)), default=0)
    if memory_mhz <= 0:
        raise GpuUnavailableError(f"GPU {i} reports no supported memory clock")
    return tuple(sorted(int(c) for c in g.get_supported_graphics_clocks(i, memory_mhz)))


def _current_clock_mhz(gpu: Any) -> int | None:
    """Current graphics clock via the NVML handle Zeus holds (Zeus has no getter)."""
    handle = getattr(gpu, "handle", None)
    if handle is None:
        return None
    try:
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_GRAPHICS))
    except pynvml.NVMLError:
        return None


def control_access() -> str:
    """How clock writes would be authorised, found without writing anything:
    ``zeusd`` (ZEUSD_SOCK_PATH/ZEUSD_HOST_PORT set), ``root`` (CAP_SYS_ADMIN) or ``no``."""
    from zeus.device.common import has_sys_admin
    from zeus.utils.zeusd import ZeusdConfig

    if ZeusdConfig.from_env() is not None:
        return "zeusd"
    return "root" if has_sys_admin() else "no"
