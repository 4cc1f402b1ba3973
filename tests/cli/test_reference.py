"""
docs/cli.md is generated from the `receipts` parser (cli/reference.py): it must be what `render()` writes
today, and hold every command, every argument and every example the parser declares.
"""

from __future__ import annotations

import argparse

from proxy_addon.cli import COMMANDS, parser
from proxy_addon.cli.reference import render
from tests.conftest import ROOT

DOC = ROOT / "docs" / "cli.md"


def test_docs_cli_md_is_what_the_parser_makes():
    assert DOC.read_text() == render(), "docs/cli.md is stale: run scripts/docs"


def test_every_command_argument_and_example_is_on_the_page():
    page = render()
    for name, command in COMMANDS.items():
        assert f"## `receipts {name}`" in page
        for example in command.examples:
            assert f"  {example}\n" in page

    def walk(p: argparse.ArgumentParser, prefix: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    assert f"## `{prefix} {name}`" in page
                    walk(sub, f"{prefix} {name}")
            elif action.option_strings and action.help != argparse.SUPPRESS and action.dest != "help":
                assert any(f"| `{flag}" in page for flag in action.option_strings), (prefix, action.option_strings)

    walk(parser(), "receipts")


def test_a_changed_parser_makes_the_page_stale(monkeypatch):
    """The staleness check can fail: a new command's help changes what render() writes."""
    before = render()
    listing = COMMANDS["list"]
    monkeypatch.setitem(COMMANDS, "list", listing.__class__(**{**listing.__dict__, "help": "list them all"}))
    assert render() != before and "list them all" in render()
