"""``python -m tidemark``: the same as the ``tidemark`` command."""

from tidemark.cli.main import main

main()
