"""``python -m attnlab.cli``."""
from . import main

main()
