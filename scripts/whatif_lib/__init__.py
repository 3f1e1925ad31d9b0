"""Building blocks of ``scripts/validate_whatif.py``: workloads, recorded runs, the validation."""
