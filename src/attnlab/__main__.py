"""``python -m attnlab``: the ``attnlab`` command."""
from .cli import main

main()
