"""Building blocks of ``scripts/results.py`` (issue 9): plan, runs, oracle, items, rendering."""
