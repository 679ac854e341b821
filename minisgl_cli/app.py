"""The Typer application behind the ``minisgl`` command.

Every user mistake ends the same way, whichever layer noticed it: one line ``error: ...`` on stderr and exit
code 2. Click's usage errors (a bad option value, a missing argument) and the engine's MinisglError types
are both turned into that line here, at the outermost boundary, so no command has to remember to. The exit
codes are in minisgl_cli/exits.py.

Nothing here, nor in the command modules, imports torch, transformers or the engine: a command imports them
when it loads a model, so ``--help``, ``--version`` and usage errors answer at once.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import typer
from typer.core import TyperCommand, TyperGroup

from core import __version__
from core.errors import MinisglError
from minisgl_cli.bench import bench
from minisgl_cli.exits import DONE, INTERRUPTED, USAGE
from minisgl_cli.generate import generate
from minisgl_cli.help_format import print_help
from minisgl_cli.models import models
from minisgl_cli.options import FLAG
from minisgl_cli.trace import trace
from minisgl_cli.verify import verify
from minisgl_cli.serve.command import serve


def _fail(message: str, code: int = USAGE) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    sys.exit(code)


class _PlainHelpFlag:
    """``--help`` and every other on/off flag listed as the flag it is, without Typer's ``<bool>`` type column
    (a command's own flags say so with ``metavar=FLAG``; this catches any that do not)."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = FLAG
        return option

    def get_params(self, ctx: Any) -> Any:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and getattr(param, "metavar", FLAG) is None:
                param.metavar = FLAG
        return params


class _Command(_PlainHelpFlag, TyperCommand):
    def format_help(self, ctx: Any, formatter: Any) -> None:
        print_help(self, ctx)  # two columns, so the help fits 80 columns (minisgl_cli/help_format.py)


class _OneLineErrors(_PlainHelpFlag, TyperGroup):
    """Runs the command non-standalone so that errors reach us, then presents them as one line."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as exc:  # Click's errors: usage mistakes (exit 2) and others (exit 1)
            ctx = getattr(exc, "ctx", None)
            hint = f" See '{ctx.command_path} --help'." if ctx is not None else ""
            _fail(_sentence(exc.format_message()) + hint, exc.exit_code)
        except typer.Abort:
            _fail("aborted", INTERRUPTED)
        except MinisglError as exc:
            _fail(str(exc))
        sys.exit(code if isinstance(code, int) else DONE)


def _sentence(message: str) -> str:
    """Click's message as the middle of our line: lower-case start ("Invalid value ..." follows 'error: '),
    no validator prefix, and a full stop before the hint."""
    message = message.replace("Value error, ", "").strip()
    if message[:2] != message[:2].upper():
        message = message[:1].lower() + message[1:]
    return message if message.endswith((".", "?", "!")) else message + "."


app = typer.Typer(name="minisgl", cls=_OneLineErrors, add_completion=False,
                  help="A small, readable and fast LLM inference engine.", pretty_exceptions_show_locals=False)
for command in (generate, trace, verify, bench):
    app.command(cls=_Command)(command)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"minisgl {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def root(ctx: typer.Context,
         version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, metavar=FLAG,
                                      help="Print the version and exit.")) -> None:
    """minisgl: continuous batching over a paged KV cache, shown step by step."""
    if ctx.invoked_subcommand is None:  # plain `minisgl`: the help, not an error
        text = ctx.get_help()  # Typer's rich help prints itself and returns nothing
        if text:
            typer.echo(text)


app.command("serve", cls=_Command)(serve)
app.command("models", cls=_Command)(models)


def main() -> None:
    app()
