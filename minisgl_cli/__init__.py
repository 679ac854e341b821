"""The ``minisgl`` command line tool."""
