"""``--help`` that fits an 80-column terminal: each option on the left with what it takes, its help beside it.

Typer's panels set a command's options in six columns (long name, short name, negative name, its short
form, type and range, help), which leaves the help a fifth of an 80-column screen: one line of help becomes
five, and a default such as the model's name is cut with an ellipsis. Here each option is one cell (``-n,
--max-tokens N``, ``--cache naive|radix``, ``--stream / --no-stream``) and the help takes the rest of the
line, wrapped at words, so nothing is cut. The panels are Typer's own (``rich_help_panel``), in the order
the command declares them. Typer's parameters are read by their click attributes (opts, type, help,
default), which its vendored click and the standalone one both have.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

NAME_WIDTH = 22  # an option's cell wider than this puts what it takes on a line of its own
ARGUMENTS, OPTIONS = "Arguments", "Options"


def print_help(command: Any, ctx: Any) -> None:
    """The command's usage line, its description and its options by panel, on stdout."""
    console = Console()
    console.print(Padding(Text(command.get_usage(ctx), style="bold"), (1, 1, 0, 1)))
    if command.help:
        paragraphs = [" ".join(p.split()) for p in command.help.split("\n\n") if p.strip()]
        console.print(Padding(Text("\n\n".join(paragraphs)), (1, 1)))
    for title, params in panels(command, ctx):
        rows = [(name_cell(param, ctx), help_cell(param, ctx)) for param in params]
        console.print(Panel(panel_body(rows), title=title, title_align="left", border_style="dim"))


def panel_body(rows: list[tuple[Text, Text]]) -> Group:
    """The rows in two columns, the names NAME_WIDTH wide in every panel; a name wider than that (a long flag) takes
    a line of its own, with its help under it where the help column starts."""
    parts: list[Any] = []
    table = None
    for name, help_text in rows:
        if max(map(len, name.plain.splitlines())) > NAME_WIDTH:
            parts += [name, Padding(help_text, (0, 0, 0, NAME_WIDTH + 2))]
            table = None
            continue
        if table is None:
            table = Table.grid(padding=(0, 2), expand=True)
            table.add_column(no_wrap=True, width=NAME_WIDTH)
            table.add_column(ratio=1)
            parts.append(table)
        table.add_row(name, help_text)
    return Group(*parts)


def panels(command: Any, ctx: Any) -> list[tuple[str, list[Any]]]:
    """The visible parameters grouped by panel: arguments first, then the options without a panel, then each
    named panel in the order its first option was declared."""
    grouped: dict[str, list[Any]] = {ARGUMENTS: [], OPTIONS: []}
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        default = ARGUMENTS if param.param_type_name == "argument" else OPTIONS
        grouped.setdefault(getattr(param, "rich_help_panel", None) or default, []).append(param)
    return [(title, params) for title, params in grouped.items() if params]


def name_cell(param: Any, ctx: Any) -> Text:
    text = _names(param, ctx)
    text.stylize("bold cyan")
    return text


def _names(param: Any, ctx: Any) -> Text:
    """``-n, --max-tokens N``: the option's names (short first) and what it takes; a flag's two names."""
    if param.param_type_name == "argument":
        return Text(param.metavar or param.name.upper())
    names = sorted(param.opts, key=len)
    if param.secondary_opts:  # an on/off pair, on two lines where one is too narrow for both
        on, off = ", ".join(names), ", ".join(param.secondary_opts)
        return Text(f"{on} / {off}" if len(on) + len(off) + 3 <= NAME_WIDTH else f"{on} /\n{off}")
    takes = "" if getattr(param, "is_flag", False) else takes_words(param, ctx)
    name = ", ".join(names)
    if not takes:
        return Text(name)
    fits = len(name) + len(takes) + 1 <= NAME_WIDTH or len(name) > NAME_WIDTH  # too long anyway: a line of its own
    return Text(f"{name} {takes}" if fits else f"{name}\n  {takes}")


def takes_words(param: Any, ctx: Any) -> str:
    """What an option takes, in a word: its metavar, its choices, or N, X, PATH or TEXT by its type."""
    shown = param.display_type_rich(ctx=ctx) if hasattr(param, "display_type_rich") else param.make_metavar(ctx)
    word = shown.strip("<>[]")
    if "|" in word or word.isupper():
        return word  # choices, or a metavar the option gave
    return {"int": "N", "int range": "N", "integer": "N", "integer range": "N", "float": "X", "float range": "X",
            "path": "PATH"}.get(word.lower(), "TEXT")


def help_cell(param: Any, ctx: Any) -> Text:
    """The help, then the default where one is worth saying (not None, not a flag's off) or [required]."""
    text = Text(" ".join((getattr(param, "help", None) or "").split()))
    default = param.default
    shown = getattr(param, "show_default", None) is not False and default not in (None, False, (), [])
    if param.required:
        text.append(" [required]", style="dim red")
    elif shown and not getattr(param, "is_flag", False):
        text.append(f" [default: {default}]", style="dim")
    return text
