"""Tests for the `receipts` CLI (proxy_addon.cli), in-process and as the installed script."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from proxy_addon.cli import main
from proxy_addon.states import State
from proxy_addon.store import Attempt, Store

ROOT = Path(__file__).resolve().parents[1]
RECEIPTS = ROOT / ".venv" / "bin" / "receipts"


def attempt(n: int) -> Attempt:
    return Attempt(
        api="dev.to", operation="articles.create", method="POST",
        target=f"https://dev.to/api/articles?page={n}", intent_fingerprint=f"sha256:{n:064x}",
        intent={"body": {"article.title": f"Post {n}"}}, principal="anonymous", flow_id=f"flow-{n}",
    )


@pytest.fixture(autouse=True)
def no_default_db(monkeypatch, tmp_path):
    """Never let a test fall back on the user's real database."""
    monkeypatch.delenv("RECEIPT_PROXY_DB", raising=False)
    monkeypatch.delenv("RECEIPT_PROXY_STATE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """
    A database with one succeeded, one outcome_unknown and one submitted receipt (in that order).
    Built once: every test using it only reads it.
    """
    path = tmp_path_factory.mktemp("cli") / "receipts.db"
    store = Store.open(path)
    ids = {}
    ok = store.begin_attempt(attempt(1)).receipt.operation_id
    store.transition(ok, State.SUCCEEDED, reason="HTTP 201", http_status=201, external_id="art_1")
    ids["succeeded"] = ok
    unk = store.begin_attempt(attempt(2)).receipt.operation_id
    store.transition(unk, State.OUTCOME_UNKNOWN, reason="upstream reset", error="server closed connection")
    ids["outcome_unknown"] = unk
    ids["submitted"] = store.begin_attempt(attempt(3)).receipt.operation_id
    store.close()
    return path, ids


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(out: str) -> dict[str, list[str]]:
    """Rows of the `list` table, by operation id."""
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["OPERATION", "ID", "STATE"], out
    return {line.split()[0]: line.split() for line in lines[1:]}


def test_list_shows_every_receipt_with_its_state(db, capsys):
    path, ids = db
    code, out, err = cli(capsys, "--db", str(path), "list")
    assert (code, err) == (0, "")
    rows = table_rows(out)
    assert set(rows) == set(ids.values())
    for state, operation_id in ids.items():
        assert rows[operation_id][1] == state
        assert "dev.to" in rows[operation_id]
    assert rows[ids["succeeded"]][4] == "201"
    assert list(rows) == [ids["submitted"], ids["outcome_unknown"], ids["succeeded"]]  # newest first


@pytest.mark.parametrize(
    "states, expected",
    [
        pytest.param(["outcome_unknown"], ["outcome_unknown"], id="outcome_unknown"),
        pytest.param(["succeeded"], ["succeeded"], id="succeeded"),
        pytest.param(["submitted"], ["submitted"], id="submitted"),
        pytest.param(["outcome_unknown", "succeeded"], ["outcome_unknown", "succeeded"], id="repeated"),
    ],
)
def test_list_state_filter(db, capsys, states, expected):
    path, ids = db
    argv = ["--db", str(path), "list"] + [a for s in states for a in ("--state", s)]
    code, out, _ = cli(capsys, *argv)
    assert code == 0
    rows = table_rows(out)
    assert set(rows) == {ids[s] for s in expected}
    assert {r[1] for r in rows.values()} == set(expected)


def test_list_state_filter_with_no_match(db, capsys):
    path, ids = db
    code, out, _ = cli(capsys, "--db", str(path), "list", "--state", "rejected")
    assert code == 0
    assert out.startswith("no receipts in ")
    assert not any(i in out for i in ids.values())


def test_list_rejects_an_unknown_state(db, capsys):
    path, _ = db
    with pytest.raises(SystemExit) as e:
        main(["--db", str(path), "list", "--state", "finished"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_list_json(db, capsys):
    path, ids = db
    code, out, _ = cli(capsys, "--db", str(path), "list", "--json")
    assert code == 0
    data = json.loads(out)
    assert [r["operation_id"] for r in data] == [ids["submitted"], ids["outcome_unknown"], ids["succeeded"]]
    by_id = {r["operation_id"]: r for r in data}
    ok = by_id[ids["succeeded"]]
    assert ok["state"] == "succeeded"
    assert ok["api"] == "dev.to" and ok["operation"] == "articles.create" and ok["method"] == "POST"
    assert ok["http_status"] == 201 and ok["external_id"] == "art_1"
    assert ok["intent"] == {"body": {"article.title": "Post 1"}}
    assert ok["intent_fingerprint"] == f"sha256:{1:064x}"
    assert ok["target"] == "https://dev.to/api/articles?page=1"
    assert ok["completed_at"] is not None
    unk = by_id[ids["outcome_unknown"]]
    assert unk["state"] == "outcome_unknown" and unk["error"] == "server closed connection"
    assert by_id[ids["submitted"]]["state"] == "submitted"
    assert by_id[ids["submitted"]]["completed_at"] is None


@pytest.mark.parametrize(
    "argv, count",
    [
        pytest.param(["--state", "outcome_unknown"], 1, id="state"),
        pytest.param(["--limit", "2"], 2, id="limit"),
        pytest.param(["--state", "rejected"], 0, id="no-match-is-empty-list"),
    ],
)
def test_list_json_filters(db, capsys, argv, count):
    path, _ = db
    code, out, _ = cli(capsys, "--db", str(path), "list", "--json", *argv)
    assert code == 0
    assert len(json.loads(out)) == count


def test_show_prints_the_receipt_and_its_events(db, capsys):
    path, ids = db
    code, out, err = cli(capsys, "--db", str(path), "show", ids["outcome_unknown"])
    assert (code, err) == (0, "")
    fields = dict(line.split(None, 1) for line in out.split("events:")[0].splitlines() if line.strip())
    assert fields["operation_id"] == ids["outcome_unknown"]
    assert fields["state"] == "outcome_unknown"
    assert fields["error"] == "server closed connection"
    assert fields["http_status"] == "-"
    events = out.split("events:\n", 1)[1].splitlines()
    assert len(events) == 2
    assert "(new) → submitted" in events[0] and "new attempt" in events[0]
    assert "submitted → outcome_unknown" in events[1] and "upstream reset" in events[1]


def test_show_json(db, capsys):
    path, ids = db
    code, out, _ = cli(capsys, "--db", str(path), "show", ids["succeeded"], "--json")
    assert code == 0
    data = json.loads(out)
    assert data["operation_id"] == ids["succeeded"] and data["state"] == "succeeded"
    assert [(e["from_state"], e["to_state"]) for e in data["events"]] == [(None, "submitted"), ("submitted", "succeeded")]
    assert data["events"][1]["reason"] == "HTTP 201"


@pytest.mark.parametrize("extra", [pytest.param([], id="text"), pytest.param(["--json"], id="json")])
def test_show_unknown_id(db, capsys, extra):
    path, _ = db
    code, out, err = cli(capsys, "--db", str(path), "show", "20260101T000000Z-0000000000", *extra)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1 and err.endswith("\n")
    assert err.startswith("Error: ") and "20260101T000000Z-0000000000" in err


@pytest.mark.parametrize(
    "relative",
    [pytest.param("missing.db", id="missing-file"), pytest.param("no/such/dir/missing.db", id="missing-dir")],
)
@pytest.mark.parametrize("command", [pytest.param(["list"], id="list"), pytest.param(["show", "x"], id="show")])
def test_missing_db_is_an_error_and_is_not_created(tmp_path, capsys, relative, command):
    path = tmp_path / relative
    code, out, err = cli(capsys, "--db", str(path), *command)
    assert code == 1
    assert out == ""
    assert err.startswith("Error: ") and err.count("\n") == 1
    assert str(path) in err
    assert not path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing created beside it either


@pytest.mark.parametrize("kind", ["other-sqlite-db", "empty-file"])
def test_not_a_receipts_db_is_a_one_line_error(tmp_path, capsys, kind):
    path = tmp_path / "other.db"
    if kind == "empty-file":
        path.write_bytes(b"")
    else:
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.commit()
        conn.close()
    code, out, err = cli(capsys, "--db", str(path), "list")
    assert code == 1
    assert err.startswith("Error: ") and err.count("\n") == 1


@pytest.mark.parametrize(
    "env",
    [
        pytest.param(lambda p: {"RECEIPT_PROXY_DB": str(p)}, id="RECEIPT_PROXY_DB"),
        pytest.param(lambda p: {"RECEIPT_PROXY_STATE_DIR": str(p.parent)}, id="RECEIPT_PROXY_STATE_DIR"),
        pytest.param(lambda p: {"RECEIPT_PROXY_DB": str(p), "RECEIPT_PROXY_STATE_DIR": "/nonexistent"},
                     id="DB-beats-STATE_DIR"),
    ],
)
def test_db_from_the_environment(db, capsys, monkeypatch, env):
    path, ids = db
    for k, v in env(path).items():
        monkeypatch.setenv(k, v)
    code, out, _ = cli(capsys, "list", "--json")
    assert code == 0
    assert {r["operation_id"] for r in json.loads(out)} == set(ids.values())


def test_no_command_prints_help(capsys):
    code, out, _ = cli(capsys)
    assert code == 0
    assert "usage: receipts" in out and "list" in out and "show" in out


def test_help_in_process(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "list" in out and "show" in out and "--db" in out


def test_installed_script(tmp_path):
    assert RECEIPTS.exists(), f"{RECEIPTS} is not installed; run scripts/test to create the venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIPT_PROXY_")}
    env["HOME"] = str(tmp_path)
    help_ = subprocess.run([str(RECEIPTS), "--help"], capture_output=True, text=True, env=env, timeout=30)
    assert help_.returncode == 0, help_.stderr
    assert "list" in help_.stdout and "usage: receipts" in help_.stdout
    assert help_.stderr == ""
