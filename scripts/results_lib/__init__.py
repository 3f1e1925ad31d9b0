"""Building blocks of ``scripts/results.py`` (docs/results.md): plan, runs, oracle, items,
rendering."""
