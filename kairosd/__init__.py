"""kairosd: the per-instance power daemon (epoch loop, GPU backends, reports)."""
