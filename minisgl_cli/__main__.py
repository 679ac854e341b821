"""``python -m minisgl_cli``: the same as the ``minisgl`` command."""

from minisgl_cli.app import main

main()
