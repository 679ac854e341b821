"""The Typer application behind the ``minisgl`` command."""

from __future__ import annotations

import typer

from core import __version__
from minisgl_cli.bench import bench

app = typer.Typer(name="minisgl", help="A small, readable and fast LLM inference engine.", no_args_is_help=True,
                  add_completion=False)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"minisgl {__version__}")
        raise typer.Exit()


@app.callback()
def root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """minisgl: continuous batching over a paged KV cache, shown step by step."""


app.command("bench")(bench)


def main() -> None:
    app()
