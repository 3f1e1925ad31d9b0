"""GPU backends behind one protocol (:class:`kairosd.gpu.base.GpuBackend`).

``zeus`` (real GPUs via Zeus → NVML or zeusd), ``sim`` (the simulated GPU of the
fake vLLM server) and ``observe`` (read-only wrapper around either). Only ``zeus_backend`` imports
Zeus/NVML, and it is itself imported lazily (``kairosd.gpu.opening``)
only when a Zeus-based backend is chosen, so CPU-only hosts never load it.
"""
