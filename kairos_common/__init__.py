"""Pieces every Kairos component shares: the wire contract between router,
daemon and id-tracker, agent identity keys, configuration loading and logging.

Standard library, structlog (logging) and prometheus_client (``vllm_metrics``)
only, so it is cheap to import from any process.
"""
