"""
`receipts` itself (proxy_addon/cli/__init__.py): which database it opens, what it says when there is
none, and its help. The installed script's help of every command: tests/e2e/cli/test_main.py.
"""

from __future__ import annotations

import json
import re
import shlex
import sqlite3
from typing import cast

import pytest

from proxy_addon.cli import COMMANDS, EPILOG, main, parser
from tests.cli.conftest import ROOT, assert_one_line_error, cli

EVERY_COMMAND = [
    pytest.param(["list"], id="list"),
    pytest.param(["show", "x"], id="show"),
    pytest.param(["blocked"], id="blocked"),
    pytest.param(["resolve", "x", "--as", "succeeded", "--note", "n"], id="resolve"),
    pytest.param(["reconcile", "--all"], id="reconcile"),
    pytest.param(["export"], id="export"),
    pytest.param(["prune", "--older-than", "1d"], id="prune"),
    pytest.param(["pending"], id="pending"),
    pytest.param(["approve", "x"], id="approve"),
    pytest.param(["deny", "x", "--note", "n"], id="deny"),
]


def test_every_command_has_a_test_of_a_missing_db():
    assert {cast(list[str], p.values[0])[0] for p in EVERY_COMMAND} == {
        name for name, c in COMMANDS.items() if c.uses_store
    }


def test_rules_commands_need_no_db(tmp_path, capsys):
    """`receipts rules` reads rules files only: a missing database is neither an error nor created."""
    missing = tmp_path / "missing.db"
    code, out, err = cli(capsys, "--db", str(missing), "rules", "check", str(ROOT / "rules" / "dev.to.yaml"))
    assert (code, err) == (0, "")
    assert "dev.to.yaml: 2 operations" in out
    code, out, _ = cli(
        capsys,
        "--db",
        str(missing),
        "rules",
        "explain",
        "POST",
        "https://dev.to/api/articles",
        "--rules",
        str(ROOT / "rules" / "dev.to.yaml"),
    )
    assert code == 0 and "operation: dev.to articles.create" in out
    assert not missing.exists()


@pytest.mark.parametrize(
    "relative",
    [pytest.param("missing.db", id="missing-file"), pytest.param("no/such/dir/missing.db", id="missing-dir")],
)
@pytest.mark.parametrize("command", EVERY_COMMAND)
def test_missing_db_is_an_error_and_is_not_created(tmp_path, capsys, relative, command):
    path = tmp_path / relative
    code, out, err = cli(capsys, "--db", str(path), *command)
    assert_one_line_error(code, out, err, str(path))
    assert not path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing created beside it either


def test_missing_default_db_says_how_to_choose_one(tmp_path, capsys):
    code, out, err = cli(capsys, "list")
    default = tmp_path / "home" / ".local" / "state" / "receipt-proxy" / "receipts.db"
    assert_one_line_error(code, out, err, str(default), "--db", "$RECEIPT_PROXY_DB")
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("kind", ["other-sqlite-db", "empty-file"])
@pytest.mark.parametrize("command", EVERY_COMMAND)
def test_not_a_receipts_db_is_a_one_line_error(tmp_path, capsys, kind, command):
    path = tmp_path / "other.db"
    if kind == "empty-file":
        path.write_bytes(b"")
    else:
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.commit()
        conn.close()
    before = path.read_bytes()
    code, out, err = cli(capsys, "--db", str(path), *command)
    assert_one_line_error(code, out, err, str(path), "not a receipts database")
    assert path.read_bytes() == before


def test_a_corrupt_file_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not sqlite at all " * 200)
    code, out, err = cli(capsys, "--db", str(path), "list")
    assert_one_line_error(code, out, err, str(path))


@pytest.mark.parametrize(
    "env",
    [
        pytest.param(lambda p: {"RECEIPT_PROXY_DB": str(p)}, id="RECEIPT_PROXY_DB"),
        pytest.param(lambda p: {"RECEIPT_PROXY_STATE_DIR": str(p.parent)}, id="RECEIPT_PROXY_STATE_DIR"),
        pytest.param(
            lambda p: {"RECEIPT_PROXY_DB": str(p), "RECEIPT_PROXY_STATE_DIR": "/nonexistent"}, id="DB-beats-STATE_DIR"
        ),
    ],
)
def test_db_from_the_environment(db, capsys, monkeypatch, env):
    path, ids = db
    for k, v in env(path).items():
        monkeypatch.setenv(k, v)
    code, out, _ = cli(capsys, "list", "--json")
    assert code == 0
    assert {r["operation_id"] for r in json.loads(out)} == set(ids.values())


def test_db_option_beats_the_environment(db, tmp_path, capsys, monkeypatch):
    path, ids = db
    monkeypatch.setenv("RECEIPT_PROXY_DB", str(tmp_path / "elsewhere.db"))
    code, out, _ = cli(capsys, "--db", str(path), "list", "--json")
    assert code == 0
    assert {r["operation_id"] for r in json.loads(out)} == set(ids.values())


def test_default_db_in_the_home_state_dir(db, tmp_path, capsys, monkeypatch):
    path, ids = db
    home_db = tmp_path / "home" / ".local" / "state" / "receipt-proxy" / "receipts.db"
    home_db.parent.mkdir(parents=True)
    home_db.write_bytes(path.read_bytes())  # the fixture's WAL was checkpointed when its store closed
    code, out, _ = cli(capsys, "list", "--json")
    assert code == 0
    assert {r["operation_id"] for r in json.loads(out)} == set(ids.values())


def test_no_command_prints_help(capsys):
    code, out, _ = cli(capsys)
    assert code == 0
    assert "usage: receipts" in out
    for name, c in COMMANDS.items():  # a name too long for the column puts its help on the next line
        assert re.search(rf"\n    {re.escape(name)}\s+{re.escape(c.help)}\n", out), name


def test_help_in_process(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--db" in out and "$RECEIPT_PROXY_DB" in out and "examples:" in out
    for name in COMMANDS:
        assert f"\n  receipts {name} " in out  # an example of every command


def example_argv(example: str) -> list[str]:
    """`receipts export --since 30d | jq ...` → ["export", "--since", "30d"]"""
    words = shlex.split(example)
    assert words[0] == "receipts"
    for i, w in enumerate(words):
        if w in ("|", ">"):
            return words[1:i]
    return words[1:]


def test_every_example_parses():
    examples = [line.strip() for line in EPILOG.splitlines() if line.startswith("  receipts ")]
    examples += [e for c in COMMANDS.values() for e in c.examples]
    assert len(examples) >= 2 * len(COMMANDS)
    for example in examples:
        args = parser().parse_args(example_argv(example))  # argparse exits on a bad one
        assert args.command in COMMANDS, example
