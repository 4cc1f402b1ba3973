"""
docs/cli.md, written from the `receipts` parser: `python -m proxy_addon.cli.reference > docs/cli.md`
(`scripts/docs` writes it, and docs/options.md). A test fails while the page differs from `render()`.

The page is built from the parser's own declarations (each command's help, description, arguments and
examples), not from argparse's help text, whose wrapping depends on the terminal and the Python version.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

from proxy_addon.cli import parser

HEADER = """\
# The `receipts` command

Generated from the `receipts` parser (`proxy_addon/cli/`) by `scripts/docs`: do not edit by hand.
`receipts --help` and `receipts COMMAND --help` print the same. How to use it day to day:
[operations.md](operations.md).
"""


def render() -> str:
    """The whole of docs/cli.md."""
    top = parser()
    lines = [HEADER, top.description or "", "", *_arguments(top), "```text", (top.epilog or "").rstrip(), "```", ""]
    commands = list(_commands(top, "receipts"))
    lines += ["| command | what it does |", "|---|---|"]
    lines += [f"| [`{name}`](#{_anchor(name)}) | {_cell(text)} |" for name, text, _ in commands]
    lines.append("")
    for name, _, sub in commands:
        lines += _command(name, sub)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).rstrip() + "\n"


def _commands(p: argparse.ArgumentParser, prefix: str) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(`receipts list`, its one-line help, its parser) for every command, subcommands after their parent."""
    for action in p._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        for name, sub in action.choices.items():
            yield f"{prefix} {name}", helps.get(name, ""), sub
            yield from _commands(sub, f"{prefix} {name}")


def _command(name: str, p: argparse.ArgumentParser) -> list[str]:
    lines = [f"## `{name}`", "", f"`{_usage(name, p)}`", ""]
    if p.description:
        lines += [p.description, ""]
    lines += _arguments(p)
    if p.epilog:
        lines += ["```text", p.epilog.rstrip(), "```"]
    return [*lines, ""]


def _arguments(p: argparse.ArgumentParser) -> list[str]:
    rows = [(_invocation(a), _help(a)) for a in _shown(p)]
    if not rows:
        return []
    return ["| argument | meaning |", "|---|---|", *(f"| `{_cell(i)}` | {_cell(h)} |" for i, h in rows), ""]


def _shown(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments a user gives: not --help, not the subcommand (its commands have sections of their own)."""
    return [
        a
        for a in p._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and a.help != argparse.SUPPRESS
    ]


def _usage(name: str, p: argparse.ArgumentParser) -> str:
    words = [name]
    for a in p._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        shown = _invocation(a, short=True)
        words.append(shown if a.required or not a.option_strings else f"[{shown}]")
    return " ".join(words)


def _invocation(a: argparse.Action, short: bool = False) -> str:
    """How the argument is written: `--state STATE`, `ID [ID ...]`, `--json`."""
    if not a.option_strings:
        return _values(a)
    flags = a.option_strings[-1:] if short else a.option_strings
    taken = a.nargs != 0
    return ", ".join(f"{f} {_values(a)}" if taken else f for f in flags)


def _values(a: argparse.Action) -> str:
    if isinstance(a.metavar, str):
        metavar = a.metavar
    elif a.choices is not None:
        metavar = "{" + ",".join(str(c) for c in a.choices) + "}"
    else:
        metavar = a.dest.upper() if a.option_strings else a.dest
    if a.nargs == "*":
        return f"[{metavar} ...]"
    if a.nargs == "+":
        return f"{metavar} [{metavar} ...]"
    if a.nargs == "?":
        return f"[{metavar}]"
    return metavar


def _help(a: argparse.Action) -> str:
    text = a.help or ""
    if "%(" in text:
        text = text % {**vars(a), "prog": "receipts"}
    if a.required and a.option_strings:
        text += " (required)"
    if isinstance(a, argparse._AppendAction) and "repeatable" not in text:
        text += " (repeatable)"
    return text


def _anchor(name: str) -> str:
    """GitHub's anchor for the heading `## \\`receipts rules check\\``."""
    return name.replace(" ", "-")


def _cell(text: str) -> str:
    """One Markdown table cell: no newline, no bare `|`."""
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    print(render(), end="")
