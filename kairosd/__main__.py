"""``python -m kairosd`` (used by tests that start the daemon as a real process)."""

from kairosd.cli import main

main()
