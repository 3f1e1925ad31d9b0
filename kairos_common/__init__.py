"""Pieces every Kairos component shares: the wire contract between router,
daemon and id-tracker, agent identity keys, configuration loading and logging.

Standard library (plus structlog for logging) only, so it is cheap to import from
any process.
"""
