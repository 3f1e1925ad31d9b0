"""``python -m idtracker`` is ``id-tracker``."""

from idtracker.cli import main

main()
