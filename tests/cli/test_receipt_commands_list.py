"""
`receipts list` (cli/receipt_commands.py). Its memory on a large database, in a process of its own:
tests/e2e/cli/test_receipt_commands_list.py.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3

import pytest

from proxy_addon.cli import main
from proxy_addon.store import Store
from tests.cli.conftest import SINCE_CASES, at, cli, list_rows
from tests.conftest import T0


def test_list_shows_every_receipt_with_its_state(db, capsys):
    path, ids = db
    code, out, err = cli(capsys, "--db", str(path), "list")
    assert (code, err) == (0, "")
    rows = list_rows(out)
    assert list(rows) == [ids["submitted"], ids["outcome_unknown"], ids["succeeded"]]  # newest first
    assert rows[ids["succeeded"]] == {
        "ID": ids["succeeded"],
        "AGE": "5d",
        "OPERATION": "dev.to/articles.create",
        "STATE": "succeeded",
        "HTTP": "201",
        "EXTERNAL-ID": "art_1",
        "BLOCKED": "-",
        "REPLAYED": "1",
        "OBSERVE": "-",
        "TARGET": "https://dev.to/api/articles?page=1",
    }
    assert rows[ids["outcome_unknown"]] == {
        "ID": ids["outcome_unknown"],
        "AGE": "4d",
        "OPERATION": "dev.to/articles.create",
        "STATE": "outcome_unknown",
        "HTTP": "-",
        "EXTERNAL-ID": "-",
        "BLOCKED": "2",
        "REPLAYED": "-",
        "OBSERVE": "-",
        "TARGET": "https://dev.to/api/articles?page=22",
    }
    assert rows[ids["submitted"]] == {
        "ID": ids["submitted"],
        "AGE": "2h",
        "OPERATION": "dev.to/articles.create",
        "STATE": "submitted",
        "HTTP": "-",
        "EXTERNAL-ID": "-",
        "BLOCKED": "-",
        "REPLAYED": "-",
        "OBSERVE": "-",
        "TARGET": "https://dev.to/api/articles?page=3",
    }


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
    rows = list_rows(out)
    assert set(rows) == {ids[s] for s in expected}
    assert {r["STATE"] for r in rows.values()} == set(expected)


def test_list_with_no_match(db, capsys):
    path, _ = db
    code, out, _ = cli(capsys, "--db", str(path), "list", "--state", "rejected")
    assert code == 0
    assert out == f"no receipts in {path} match these filters\n"


def test_list_of_an_empty_database(tmp_path, capsys):
    path = tmp_path / "empty.db"
    Store.open(path).close()
    code, out, _ = cli(capsys, "--db", str(path), "list")
    assert (code, out) == (0, f"no receipts in {path}\n")
    code, out, _ = cli(capsys, "--db", str(path), "list", "--json")
    assert (code, json.loads(out)) == (0, [])


@pytest.mark.parametrize("argv", [["--state", "finished"], ["--limit", "0"], ["--limit", "ten"]])
def test_list_usage_errors(db, capsys, argv):
    path, _ = db
    with pytest.raises(SystemExit) as e:
        main(["--db", str(path), "list", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: receipts list" in err and f"argument {argv[0]}" in err


def test_list_json(db, capsys):
    path, ids = db
    code, out, _ = cli(capsys, "--db", str(path), "list", "--json")
    assert code == 0
    data = json.loads(out)
    assert [r["operation_id"] for r in data] == [ids["submitted"], ids["outcome_unknown"], ids["succeeded"]]
    by_id = {r["operation_id"]: r for r in data}
    assert by_id[ids["succeeded"]] == {
        "operation_id": ids["succeeded"],
        "api": "dev.to",
        "operation": "articles.create",
        "method": "POST",
        "target": "https://dev.to/api/articles?page=1",
        "state": "succeeded",
        "intent_fingerprint": f"sha256:{1:064x}",
        "intent": {"body": {"article.title": "Post 1"}},
        "principal": "anonymous",
        "submitted_at": at(),
        "updated_at": at(),
        "completed_at": at(),
        "http_status": 201,
        "error": None,
        "external_id": "art_1",
        "flow_id": "flow-1",
        "retry_of": None,
        "instance": None,
        "idempotency_key": None,
        "client_key": None,
        "idempotency_key_at": None,
        "raw_target": None,
        "failed_reads": 0,
        "next_read_at": None,
        "fingerprint_scheme": None,
        "fingerprint_rule": None,
        "read_principal": None,
        "upstream_timeout": None,
        "in_flight_until": None,
        "waiting_for": None,
        "mcp_rounds": 0,
        "waiting_until": None,
        "task_hint": None,
        "task_status": None,
        "task_revision": None,
        "shadow_of": None,
        "trace_parent": None,  # its span's W3C traceparent while OpenTelemetry is on (docs/operations.md)
        "response_status": 201,
        # sealed: a 12-byte nonce, the headers as JSON, a newline, the body, a 16-byte tag (store/sealing.py)
        "response_size": 12 + len('[["content-type", "application/json"]]\n{"id": "RESPONSE-BODY-MARKER-5e1f"}') + 16,
        "response_encrypted": True,
        "blocked": 0,
        "replayed": 1,
        "would_block": 0,
        "would_replay": 0,
        "would_hold": 0,
        "would_deny": 0,
        "would_refuse": 0,
        "duplicate_sent": 0,
    }
    unk = by_id[ids["outcome_unknown"]]
    assert (unk["state"], unk["error"], unk["http_status"], unk["response_status"]) == (
        "outcome_unknown",
        "server closed connection",
        None,
        None,
    )
    assert (unk["blocked"], unk["replayed"], unk["submitted_at"]) == (2, 0, at(hours=22))
    sub = by_id[ids["submitted"]]
    assert (sub["state"], sub["completed_at"], sub["blocked"], sub["replayed"]) == ("submitted", None, 0, 0)


@pytest.mark.parametrize(
    "argv, expected",
    [
        pytest.param(["--state", "outcome_unknown"], ["outcome_unknown"], id="state"),
        pytest.param(["--limit", "2"], ["submitted", "outcome_unknown"], id="limit-keeps-the-newest"),
        pytest.param(["--state", "rejected"], [], id="no-match-is-empty-list"),
        pytest.param(["--since", "2026-03-01T12:00:00Z"], ["submitted", "outcome_unknown", "succeeded"], id="since-T0"),
        pytest.param(["--since", "4d"], ["submitted"], id="since-age"),
    ],
)
def test_list_json_filters(db, capsys, argv, expected):
    path, ids = db
    code, out, _ = cli(capsys, "--db", str(path), "list", "--json", *argv)
    assert code == 0
    assert [r["operation_id"] for r in json.loads(out)] == [ids[s] for s in expected]


@pytest.mark.parametrize(
    "operation, expected",
    [
        pytest.param("articles.create", ["medium.com/articles.create", "dev.to/articles.create"], id="name"),
        pytest.param("dev.to/articles.create", ["dev.to/articles.create"], id="api/name"),
        pytest.param("medium.com/articles.create", ["medium.com/articles.create"], id="other-api"),
        pytest.param("articles.update", ["dev.to/articles.update"], id="other-name"),
        pytest.param("dev.to/articles.delete", [], id="no-such-operation"),
        pytest.param("dev.to", [], id="api-alone-is-not-an-operation"),
    ],
)
def test_list_operation_filter(timeline, capsys, operation, expected):
    path, ids = timeline
    now = T0 + dt.timedelta(hours=4)
    code, out, _ = cli(capsys, "--db", str(path), "list", "--operation", operation, "--json", now=now)
    assert code == 0
    assert [r["operation_id"] for r in json.loads(out)] == [ids[k] for k in expected]
    code, out, _ = cli(capsys, "--db", str(path), "list", "--operation", operation, now=now)
    if expected:
        assert [r["OPERATION"] for r in list_rows(out).values()] == expected
    else:
        assert out == f"no receipts in {path} match these filters\n"


@pytest.mark.parametrize("since, expected", SINCE_CASES)
def test_list_since(timeline, capsys, since, expected):
    path, ids = timeline
    code, out, err = cli(capsys, "--db", str(path), "list", "--since", since, "--json", now=T0 + dt.timedelta(hours=4))
    assert (code, err) == (0, "")
    assert [r["operation_id"] for r in json.loads(out)] == [ids[k] for k in expected]


def test_list_operation_and_since_together(timeline, capsys):
    path, ids = timeline
    code, out, _ = cli(
        capsys,
        "--db",
        str(path),
        "list",
        "--operation",
        "articles.create",
        "--since",
        "2h",
        "--json",
        now=T0 + dt.timedelta(hours=4),
    )
    assert code == 0
    assert [r["operation_id"] for r in json.loads(out)] == [ids["medium.com/articles.create"]]


MANY = 25_000  # under SQLite's 32766 host parameters: the old one-query read did not fail for that


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """MANY receipts with a 1.5 KB intent each, written in one transaction (as fast as a test can)."""
    path = tmp_path_factory.mktemp("many") / "receipts.db"
    Store.open(path).close()
    intent = json.dumps({"body": {"text": "x" * 1500}})
    stamp = at()
    rows = [
        (
            f"20260301T120000Z-{i:010x}",
            "api",
            "op",
            "POST",
            f"https://h/{i}",
            "succeeded",
            f"fp-{i}",
            intent,
            "anonymous",
            stamp,
            stamp,
        )
        for i in range(MANY)
    ]
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO receipts (operation_id, api, operation, method, target, state, intent_fingerprint, intent, "
            "principal, submitted_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
    return path


def test_list_json_streamed_is_the_json_of_the_whole_list(many, capsys):
    """The array printed an item at a time is the text `json.dumps(list, indent=2)` printed."""
    code, out, _ = cli(capsys, "--db", str(many), "list", "--json", "--limit", "1200")
    assert code == 0
    data = json.loads(out)
    assert len(data) == 1200 and len({d["operation_id"] for d in data}) == 1200
    assert out == json.dumps(data, indent=2) + "\n"
    assert [d["operation_id"] for d in data] == [f"20260301T120000Z-{i:010x}" for i in range(MANY - 1, MANY - 1201, -1)]
