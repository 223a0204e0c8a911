"""``python -m agent_stores.cli``."""

from . import main

main()
