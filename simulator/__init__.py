"""Program-level discrete-event simulator of agents on vLLM instances under DVFS,
plus the fake vLLM server and the simulated GPU used by tests and the demo."""
