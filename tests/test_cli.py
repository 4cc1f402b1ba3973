"""Tests for the `receipts` CLI (proxy_addon.cli), in-process and as the installed script."""

from __future__ import annotations

import dataclasses

import datetime as dt
import getpass
import http.client
import json
import os
import re
import shlex
import sqlite3
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy_addon import cli as cli_module
from proxy_addon.cli import COMMANDS, EPILOG, main, parser
from proxy_addon.paths import DEFAULT_RULES
from proxy_addon.rules import load_rules_path
from proxy_addon.states import State
from proxy_addon.store import Attempt, RecordedResponse, Store
from tests.conftest import T0, FakeClock
from tests.upstream import Upstream

ROOT = Path(__file__).resolve().parents[1]
RECEIPTS = ROOT / ".venv" / "bin" / "receipts"

# "Now" for the CLI when it reads the `db` fixture: five days after it was built.
NOW = T0 + dt.timedelta(days=5)
BODY_MARKER = "RESPONSE-BODY-MARKER-5e1f"
LIST_HEADERS = ["ID", "AGE", "OPERATION", "STATE", "HTTP", "EXTERNAL-ID", "BLOCKED", "REPLAYED", "TARGET"]
BLOCKED_HEADERS = ["TIME", "KIND", "RECEIPT", "OPERATION", "STATE", "REASON"]
UNKNOWN_ID = "20260101T000000Z-0000000000"


def attempt(n: int, *, api: str = "dev.to", operation: str = "articles.create", flow_id: str | None = None) -> Attempt:
    return Attempt(
        api=api, operation=operation, method="POST",
        target=f"https://{api}/api/articles?page={n}", intent_fingerprint=f"sha256:{n:064x}",
        intent={"body": {"article.title": f"Post {n}"}}, principal="anonymous", flow_id=flow_id or f"flow-{n}",
    )


def at(**delta) -> str:
    """The store's text for T0 + delta."""
    return (T0 + dt.timedelta(**delta)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.fixture(autouse=True)
def no_default_db(monkeypatch, tmp_path):
    """Never let a test fall back on the user's real database."""
    monkeypatch.delenv("RECEIPT_PROXY_DB", raising=False)
    monkeypatch.delenv("RECEIPT_PROXY_STATE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """
    One succeeded, one outcome_unknown and one submitted receipt (in that order), the first
    with a recorded response replayed once, the second with two blocked duplicates.
    Built once on a FakeClock starting at T0: every test using it only reads it.

        T0        succeeded (HTTP 201, art_1, response recorded)
        T0+1h     a duplicate of it, replayed
        T0+22h    outcome_unknown
        T0+23h    a duplicate of it, blocked (flow-22)
        T0+24h    another, blocked (flow-dup)
        NOW-2h    submitted
    """
    path = tmp_path_factory.mktemp("cli") / "receipts.db"
    clock = FakeClock()
    store = Store.open(path, clock=clock)
    ids = {}
    ok = store.begin_attempt(attempt(1)).receipt.operation_id
    store.transition(ok, State.SUCCEEDED, reason="HTTP 201", http_status=201, external_id="art_1",
                     response=RecordedResponse(201, [("content-type", "application/json")],
                                               json.dumps({"id": BODY_MARKER}).encode()))
    ids["succeeded"] = ok
    clock.now = T0 + dt.timedelta(hours=1)
    assert store.begin_attempt(attempt(1)).kind == "replay"
    clock.now = T0 + dt.timedelta(hours=22)
    unk = store.begin_attempt(attempt(22)).receipt.operation_id
    store.transition(unk, State.OUTCOME_UNKNOWN, reason="upstream reset", error="server closed connection")
    ids["outcome_unknown"] = unk
    clock.now = T0 + dt.timedelta(hours=23)
    assert store.begin_attempt(attempt(22)).kind == "blocked"
    clock.now = T0 + dt.timedelta(hours=24)
    assert store.begin_attempt(attempt(22, flow_id="flow-dup")).kind == "blocked"
    clock.now = NOW - dt.timedelta(hours=2)
    ids["submitted"] = store.begin_attempt(attempt(3)).receipt.operation_id
    store.close()
    return path, ids


@pytest.fixture(scope="module")
def timeline(tmp_path_factory):
    """Three receipts of three operations, an hour or two apart; read at T0+4h."""
    path = tmp_path_factory.mktemp("timeline") / "receipts.db"
    clock = FakeClock()
    store = Store.open(path, clock=clock)
    ids = {}
    ids["dev.to/articles.create"] = store.begin_attempt(attempt(1)).receipt.operation_id  # T0
    clock.advance(3600)
    ids["dev.to/articles.update"] = store.begin_attempt(attempt(2, operation="articles.update")).receipt.operation_id
    clock.advance(2 * 3600)
    ids["medium.com/articles.create"] = store.begin_attempt(attempt(3, api="medium.com")).receipt.operation_id
    store.close()
    return path, ids


def cli(capsys, *argv: str, now: dt.datetime = NOW) -> tuple[int, str, str]:
    code = main(list(argv), clock=lambda: now)
    out, err = capsys.readouterr()
    return code, out, err


def dump(path: Path) -> tuple[list, list]:
    """Both tables, every column: to show a command wrote nothing."""
    conn = sqlite3.connect(path)
    try:
        return (conn.execute("SELECT * FROM receipts ORDER BY operation_id").fetchall(),
                conn.execute("SELECT * FROM receipt_events ORDER BY id").fetchall())
    finally:
        conn.close()


def assert_one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 1, (out, err)
    assert out == ""
    assert err.startswith("Error: ") and err.endswith("\n") and err.count("\n") == 1, err
    for n in needles:
        assert n in err, (n, err)


def table(out: str, headers: list[str]) -> list[dict[str, str]]:
    """Rows of a table whose cells have no spaces, except the last column's."""
    lines = out.splitlines()
    assert lines[0].split() == headers, out
    return [dict(zip(headers, line.split(None, len(headers) - 1))) for line in lines[1:]]


def list_rows(out: str) -> dict[str, dict[str, str]]:
    """Rows of the `list` table, by operation id, in order."""
    return {row["ID"]: row for row in table(out, LIST_HEADERS)}


# --- list ---------------------------------------------------------------------------------


def test_list_shows_every_receipt_with_its_state(db, capsys):
    path, ids = db
    code, out, err = cli(capsys, "--db", str(path), "list")
    assert (code, err) == (0, "")
    rows = list_rows(out)
    assert list(rows) == [ids["submitted"], ids["outcome_unknown"], ids["succeeded"]]  # newest first
    assert rows[ids["succeeded"]] == {
        "ID": ids["succeeded"], "AGE": "5d", "OPERATION": "dev.to/articles.create", "STATE": "succeeded",
        "HTTP": "201", "EXTERNAL-ID": "art_1", "BLOCKED": "-", "REPLAYED": "1",
        "TARGET": "https://dev.to/api/articles?page=1",
    }
    assert rows[ids["outcome_unknown"]] == {
        "ID": ids["outcome_unknown"], "AGE": "4d", "OPERATION": "dev.to/articles.create", "STATE": "outcome_unknown",
        "HTTP": "-", "EXTERNAL-ID": "-", "BLOCKED": "2", "REPLAYED": "-",
        "TARGET": "https://dev.to/api/articles?page=22",
    }
    assert rows[ids["submitted"]] == {
        "ID": ids["submitted"], "AGE": "2h", "OPERATION": "dev.to/articles.create", "STATE": "submitted",
        "HTTP": "-", "EXTERNAL-ID": "-", "BLOCKED": "-", "REPLAYED": "-",
        "TARGET": "https://dev.to/api/articles?page=3",
    }


@pytest.mark.parametrize(
    "seconds, expected",
    [(0, "0s"), (59, "59s"), (60, "1m"), (3 * 60 + 59, "3m"), (3599, "59m"), (3600, "1h"), (2 * 3600, "2h"),
     (86399, "23h"), (86400, "1d"), (5 * 86400 + 7200, "5d"), (400 * 86400, "400d"), (-30, "0s")],
)
def test_age(seconds, expected):
    assert cli_module.age("2026-03-01T12:00:00.000000Z", T0 + dt.timedelta(seconds=seconds)) == expected


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
    path, ids = db
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
        "operation_id": ids["succeeded"], "api": "dev.to", "operation": "articles.create", "method": "POST",
        "target": "https://dev.to/api/articles?page=1", "state": "succeeded",
        "intent_fingerprint": f"sha256:{1:064x}", "intent": {"body": {"article.title": "Post 1"}},
        "principal": "anonymous", "submitted_at": at(), "updated_at": at(), "completed_at": at(),
        "http_status": 201, "error": None, "external_id": "art_1", "flow_id": "flow-1", "retry_of": None,
        "instance": None, "idempotency_key": None, "client_key": None, "idempotency_key_at": None, "response_status": 201,
        "blocked": 0, "replayed": 1,
    }
    unk = by_id[ids["outcome_unknown"]]
    assert (unk["state"], unk["error"], unk["http_status"], unk["response_status"]) == (
        "outcome_unknown", "server closed connection", None, None)
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


# Submitted at T0 (12:00Z), T0+1h and T0+3h; now is T0+4h.
SINCE_CASES = [
    pytest.param("5h", ["medium.com/articles.create", "dev.to/articles.update", "dev.to/articles.create"], id="5h"),
    pytest.param("3h", ["medium.com/articles.create", "dev.to/articles.update"], id="3h-includes-the-boundary"),
    pytest.param("90m", ["medium.com/articles.create"], id="90m"),
    pytest.param("30m", [], id="30m"),
    pytest.param("1d", ["medium.com/articles.create", "dev.to/articles.update", "dev.to/articles.create"], id="1d"),
    pytest.param("2026-03-01", ["medium.com/articles.create", "dev.to/articles.update", "dev.to/articles.create"],
                 id="date"),
    pytest.param("2026-03-02", [], id="date-after"),
    pytest.param("2026-03-01T13:00:00Z", ["medium.com/articles.create", "dev.to/articles.update"], id="Z"),
    pytest.param("2026-03-01T13:00:01Z", ["medium.com/articles.create"], id="a-second-later"),
    pytest.param("2026-03-01T14:00:00+01:00", ["medium.com/articles.create", "dev.to/articles.update"], id="offset"),
    pytest.param("2026-03-01T13:00:00", ["medium.com/articles.create", "dev.to/articles.update"], id="naive-is-UTC"),
]


@pytest.mark.parametrize("since, expected", SINCE_CASES)
def test_list_since(timeline, capsys, since, expected):
    path, ids = timeline
    code, out, err = cli(capsys, "--db", str(path), "list", "--since", since, "--json", now=T0 + dt.timedelta(hours=4))
    assert (code, err) == (0, "")
    assert [r["operation_id"] for r in json.loads(out)] == [ids[k] for k in expected]


def test_list_operation_and_since_together(timeline, capsys):
    path, ids = timeline
    code, out, _ = cli(capsys, "--db", str(path), "list", "--operation", "articles.create", "--since", "2h", "--json",
                       now=T0 + dt.timedelta(hours=4))
    assert code == 0
    assert [r["operation_id"] for r in json.loads(out)] == [ids["medium.com/articles.create"]]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2h", "2026-03-06T10:00:00.000000Z"),
        ("90m", "2026-03-06T10:30:00.000000Z"),
        ("7d", "2026-02-27T12:00:00.000000Z"),
        ("1w", "2026-02-27T12:00:00.000000Z"),
        ("45s", "2026-03-06T11:59:15.000000Z"),
        ("2026-11-01", "2026-11-01T00:00:00.000000Z"),
        ("2026-11-01T12:00:00Z", "2026-11-01T12:00:00.000000Z"),
        ("2026-11-01T12:00:00.5Z", "2026-11-01T12:00:00.500000Z"),
        ("2026-11-01T12:00:00-05:00", "2026-11-01T17:00:00.000000Z"),
        ("2026-11-01 12:00", "2026-11-01T12:00:00.000000Z"),
    ],
)
def test_parse_since(text, expected):
    assert cli_module.parse_since(text, NOW) == expected


@pytest.fixture
def new_york(monkeypatch):
    """The machine's local time zone is five hours behind UTC in March."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_since_without_a_zone_is_utc_not_local_time(timeline, capsys, new_york):
    assert dt.datetime(2026, 3, 1, 12).astimezone().utcoffset() == dt.timedelta(hours=-5)  # the fixture works
    assert cli_module.parse_since("2026-03-01T13:00:00", NOW) == "2026-03-01T13:00:00.000000Z"
    path, ids = timeline
    code, out, _ = cli(capsys, "--db", str(path), "list", "--since", "2026-03-01", "--json")
    assert [r["operation_id"] for r in json.loads(out)] == [
        ids["medium.com/articles.create"], ids["dev.to/articles.update"], ids["dev.to/articles.create"]]


BAD_SINCE = ["yesterday", "2h ago", "-2h", "2", "h", "2026-13-01", "2026-11-01T25:00", "1.5d", "", "99999999999d"]


@pytest.mark.parametrize(
    "command, since",
    [("list", s) for s in BAD_SINCE] + [(c, s) for c in ("blocked", "export") for s in ("yesterday", "-2h", "2")],
)
def test_bad_since_is_a_one_line_error(db, capsys, command, since):
    path, _ = db
    before = dump(path)
    code, out, err = cli(capsys, "--db", str(path), command, f"--since={since}")  # =: "-2h" is not an option
    assert_one_line_error(code, out, err, "--since", repr(since))
    assert dump(path) == before


# --- show ---------------------------------------------------------------------------------


def show_sections(out: str) -> tuple[dict[str, str], list[str], list[str]]:
    head, rest = out.split("events:\n", 1)
    fields = dict(line.split(None, 1) for line in head.splitlines())
    events, _, dups = rest.partition("duplicates")
    return fields, events.splitlines(), dups.splitlines()


def test_show_prints_the_receipt_its_events_and_its_duplicates(db, capsys):
    path, ids = db
    code, out, err = cli(capsys, "--db", str(path), "show", ids["outcome_unknown"])
    assert (code, err) == (0, "")
    fields, events, dups = show_sections(out)
    assert fields["operation_id"] == ids["outcome_unknown"]
    assert fields["state"] == "outcome_unknown"
    assert fields["operation"] == "articles.create" and fields["api"] == "dev.to"
    assert fields["error"] == "server closed connection"
    assert fields["http_status"] == "-" and fields["response_status"] == "-"
    assert fields["intent"] == '{"body": {"article.title": "Post 22"}}'
    assert fields["submitted_at"] == at(hours=22)
    assert len(events) == 2
    assert "(new) → submitted" in events[0] and "new attempt" in events[0]
    assert "submitted → outcome_unknown" in events[1] and "upstream reset" in events[1]
    assert dups[0] == " (2):"
    assert dups[1].split(None, 4) == [at(hours=23), "blocked", "proxy", "flow-22",
                                      "duplicate blocked: the first attempt is unresolved"]
    assert dups[2].split(None, 4)[:4] == [at(hours=24), "blocked", "proxy", "flow-dup"]
    assert len(dups) == 3


def test_show_a_receipt_without_duplicates(db, capsys):
    path, ids = db
    code, out, _ = cli(capsys, "--db", str(path), "show", ids["submitted"])
    assert code == 0
    fields, events, dups = show_sections(out)
    assert fields["state"] == "submitted" and fields["completed_at"] == "-"
    assert len(events) == 1 and "(new) → submitted" in events[0]
    assert dups == [": none"]


def test_show_json(db, capsys):
    path, ids = db
    code, out, _ = cli(capsys, "--db", str(path), "show", ids["succeeded"], "--json")
    assert code == 0
    data = json.loads(out)
    assert data["operation_id"] == ids["succeeded"] and data["state"] == "succeeded"
    assert (data["http_status"], data["response_status"], data["external_id"]) == (201, 201, "art_1")
    assert "response" not in data and "response_body" not in data and BODY_MARKER not in out
    assert [{k: e[k] for k in ("event", "from_state", "to_state", "reason", "actor", "at")} for e in data["events"]] == [
        {"event": "transition", "from_state": None, "to_state": "submitted", "reason": "new attempt",
         "actor": "proxy", "at": at()},
        {"event": "transition", "from_state": "submitted", "to_state": "succeeded", "reason": "HTTP 201",
         "actor": "proxy", "at": at()},
    ]
    assert all(e["operation_id"] == ids["succeeded"] for e in data["events"])
    assert data["events"][0]["flow_id"] == "flow-1"
    [dup] = data["duplicates"]
    assert {k: v for k, v in dup.items() if k != "id"} == {
        "operation_id": ids["succeeded"], "at": at(hours=1), "event": "replayed", "from_state": "succeeded",
        "to_state": "succeeded", "reason": "duplicate answered with the recorded response", "actor": "proxy",
        "flow_id": "flow-1",
    }
    assert dup["id"] > data["events"][1]["id"]


def test_show_json_duplicates_of_an_unresolved_receipt(db, capsys):
    path, ids = db
    code, out, _ = cli(capsys, "--db", str(path), "show", ids["outcome_unknown"], "--json")
    assert code == 0
    data = json.loads(out)
    assert [e["to_state"] for e in data["events"]] == ["submitted", "outcome_unknown"]
    assert [(d["event"], d["at"], d["flow_id"]) for d in data["duplicates"]] == [
        ("blocked", at(hours=23), "flow-22"), ("blocked", at(hours=24), "flow-dup")]


@pytest.mark.parametrize("extra", [pytest.param([], id="text"), pytest.param(["--json"], id="json")])
def test_show_unknown_id(db, capsys, extra):
    path, _ = db
    code, out, err = cli(capsys, "--db", str(path), "show", UNKNOWN_ID, *extra)
    assert_one_line_error(code, out, err, UNKNOWN_ID)


# --- blocked ------------------------------------------------------------------------------


def test_blocked_lists_duplicates_newest_first(db, capsys):
    path, ids = db
    code, out, err = cli(capsys, "--db", str(path), "blocked")
    assert (code, err) == (0, "")
    assert table(out, BLOCKED_HEADERS) == [
        {"TIME": "2026-03-02T12:00:00Z", "KIND": "blocked", "RECEIPT": ids["outcome_unknown"],
         "OPERATION": "dev.to/articles.create", "STATE": "outcome_unknown",
         "REASON": "duplicate blocked: the first attempt is unresolved"},
        {"TIME": "2026-03-02T11:00:00Z", "KIND": "blocked", "RECEIPT": ids["outcome_unknown"],
         "OPERATION": "dev.to/articles.create", "STATE": "outcome_unknown",
         "REASON": "duplicate blocked: the first attempt is unresolved"},
        {"TIME": "2026-03-01T13:00:00Z", "KIND": "replayed", "RECEIPT": ids["succeeded"],
         "OPERATION": "dev.to/articles.create", "STATE": "succeeded",
         "REASON": "duplicate answered with the recorded response"},
    ]


def test_blocked_json(db, capsys):
    path, ids = db
    code, out, _ = cli(capsys, "--db", str(path), "blocked", "--json")
    assert code == 0
    data = json.loads(out)
    assert [(d["event"], d["at"], d["operation_id"]) for d in data] == [
        ("blocked", at(hours=24), ids["outcome_unknown"]),
        ("blocked", at(hours=23), ids["outcome_unknown"]),
        ("replayed", at(hours=1), ids["succeeded"]),
    ]
    assert data[0] == {
        "at": at(hours=24), "event": "blocked", "operation_id": ids["outcome_unknown"], "api": "dev.to",
        "operation": "articles.create", "receipt_state": "outcome_unknown",
        "reason": "duplicate blocked: the first attempt is unresolved", "actor": "proxy", "flow_id": "flow-dup",
    }
    assert (data[2]["receipt_state"], data[2]["reason"]) == ("succeeded", "duplicate answered with the recorded response")


@pytest.mark.parametrize(
    "argv, expected",
    [
        pytest.param(["--since", "4d"], [24], id="age-boundary-included"),
        pytest.param(["--since", "2026-03-01T13:00:00Z"], [24, 23, 1], id="iso-boundary-included"),
        pytest.param(["--since", "2026-03-01T13:00:01Z"], [24, 23], id="a-second-later"),
        pytest.param(["--limit", "1"], [24], id="limit-keeps-the-newest"),
        pytest.param(["--since", "1d"], [], id="none"),
    ],
)
def test_blocked_filters(db, capsys, argv, expected):
    path, _ = db
    code, out, _ = cli(capsys, "--db", str(path), "blocked", "--json", *argv)
    assert code == 0
    assert [d["at"] for d in json.loads(out)] == [at(hours=h) for h in expected]


def test_blocked_with_none(db, tmp_path, capsys):
    path, _ = db
    code, out, _ = cli(capsys, "--db", str(path), "blocked", "--since", "2026-04-01")
    assert (code, out) == (0, f"no blocked or replayed duplicates in {path} since 2026-04-01T00:00:00.000000Z\n")
    empty = tmp_path / "empty.db"
    Store.open(empty).close()
    code, out, _ = cli(capsys, "--db", str(empty), "blocked")
    assert (code, out) == (0, f"no blocked or replayed duplicates in {empty}\n")


def test_blocked_shows_the_receipts_current_state(review, capsys, alice):
    path, ids, clock, store = review
    rid = ids["outcome_unknown"]
    assert store.begin_attempt(attempt(1)).kind == "blocked"
    code, _, _ = cli(capsys, "--db", str(path), "resolve", rid, "--as", "succeeded", "--note", "it is live")
    assert code == 0
    code, out, _ = cli(capsys, "--db", str(path), "blocked", now=clock.now)
    [row] = table(out, BLOCKED_HEADERS)
    assert (row["KIND"], row["RECEIPT"], row["STATE"]) == ("blocked", rid, "succeeded")
    code, out, _ = cli(capsys, "--db", str(path), "blocked", "--json", now=clock.now)
    [dup] = json.loads(out)
    assert (dup["operation_id"], dup["receipt_state"]) == (rid, "succeeded")


# --- export -------------------------------------------------------------------------------


def test_export_is_json_lines_oldest_first_without_bodies(db, capsys):
    path, ids = db
    code, out, err = cli(capsys, "--db", str(path), "export")
    assert (code, err) == (0, "")
    assert BODY_MARKER not in out
    lines = out.splitlines()
    assert len(lines) == 3 and out.endswith("\n")
    records = [json.loads(line) for line in lines]
    assert [r["operation_id"] for r in records] == [ids["succeeded"], ids["outcome_unknown"], ids["submitted"]]
    ok, unk, sub = records
    assert "response" not in ok and "response_body" not in ok and "response_headers" not in ok
    assert (ok["state"], ok["http_status"], ok["response_status"], ok["external_id"]) == ("succeeded", 201, 201, "art_1")
    assert ok["intent"] == {"body": {"article.title": "Post 1"}} and ok["submitted_at"] == at()
    assert [(e["event"], e["from_state"], e["to_state"], e["at"]) for e in ok["events"]] == [
        ("transition", None, "submitted", at()),
        ("transition", "submitted", "succeeded", at()),
        ("replayed", "succeeded", "succeeded", at(hours=1)),
    ]
    assert [(e["event"], e["to_state"], e["flow_id"]) for e in unk["events"]] == [
        ("transition", "submitted", "flow-22"), ("transition", "outcome_unknown", None),
        ("blocked", "outcome_unknown", "flow-22"), ("blocked", "outcome_unknown", "flow-dup"),
    ]
    assert (unk["error"], unk["response_status"]) == ("server closed connection", None)
    assert (sub["state"], len(sub["events"]), sub["events"][0]["reason"]) == ("submitted", 1, "new attempt")
    # the same fields as `show --json`, events and duplicates together
    code, shown, _ = cli(capsys, "--db", str(path), "show", ids["outcome_unknown"], "--json")
    shown = json.loads(shown)
    assert {k: v for k, v in unk.items() if k != "events"} == {k: v for k, v in shown.items()
                                                              if k not in ("events", "duplicates")}
    assert unk["events"] == shown["events"] + shown["duplicates"]


@pytest.mark.parametrize("since, expected", SINCE_CASES)
def test_export_since(timeline, capsys, since, expected):
    path, ids = timeline
    code, out, _ = cli(capsys, "--db", str(path), "export", "--since", since, now=T0 + dt.timedelta(hours=4))
    assert code == 0
    assert [json.loads(line)["operation_id"] for line in out.splitlines()] == [ids[k] for k in reversed(expected)]


# --- resolve ------------------------------------------------------------------------------


@pytest.fixture
def review(tmp_path):
    """A fresh database with a receipt in each state a human might try to resolve; writable."""
    path = tmp_path / "receipts.db"
    clock = FakeClock()
    store = Store.open(path, clock=clock)
    ids = {}
    ids["outcome_unknown"] = store.begin_attempt(attempt(1)).receipt.operation_id
    store.transition(ids["outcome_unknown"], State.OUTCOME_UNKNOWN, reason="upstream reset")
    ids["manual_review"] = store.begin_attempt(attempt(2)).receipt.operation_id
    store.transition(ids["manual_review"], State.OUTCOME_UNKNOWN, reason="upstream reset")
    store.transition(ids["manual_review"], State.MANUAL_REVIEW, reason="reconcile could not tell")
    ids["succeeded"] = store.begin_attempt(attempt(3)).receipt.operation_id
    store.transition(ids["succeeded"], State.SUCCEEDED, reason="HTTP 201", http_status=201)
    ids["submitted"] = store.begin_attempt(attempt(4)).receipt.operation_id
    ids["reconciling"] = store.begin_attempt(attempt(5)).receipt.operation_id
    store.transition(ids["reconciling"], State.OUTCOME_UNKNOWN, reason="upstream reset")
    store.claim_for_reconcile(ids["reconciling"], actor="reconciler")
    ids["rejected"] = store.begin_attempt(attempt(6)).receipt.operation_id
    store.transition(ids["rejected"], State.REJECTED, reason="HTTP 422", http_status=422)
    clock.advance(600)
    yield path, ids, clock, store
    store.close()


@pytest.fixture
def alice(monkeypatch):
    monkeypatch.setenv("LOGNAME", "alice")


@pytest.mark.parametrize("resolution", ["succeeded", "safe_to_retry", "rejected"])
@pytest.mark.parametrize("start", ["outcome_unknown", "manual_review"])
def test_resolve(review, capsys, alice, start, resolution):
    path, ids, clock, store = review
    rid = ids[start]
    events_before = store.events(rid)
    code, out, err = cli(capsys, "--db", str(path), "resolve", rid, "--as", resolution,
                         "--note", "  checked the dashboard  ", now=clock.now)
    assert (code, err) == (0, "")
    assert out == f"{rid} is now {resolution} (was {start})\n"
    r = store.get(rid)
    assert r.state == resolution and r.external_id is None
    new = store.events(rid)[len(events_before):]
    expected = [("manual_review", resolution, "resolved by hand: checked the dashboard")]
    if start == "outcome_unknown":
        expected.insert(0, ("outcome_unknown", "manual_review", "taken into review: checked the dashboard"))
    assert [(e.from_state, e.to_state, e.reason) for e in new] == expected
    assert {(e.actor, e.at) for e in new} == {("cli:alice", at(minutes=10))}


def test_resolve_succeeded_with_an_external_id_shows_in_show_json(review, capsys, alice):
    path, ids, clock, _ = review
    rid = ids["manual_review"]
    code, out, _ = cli(capsys, "--db", str(path), "resolve", rid, "--as", "succeeded", "--note", "live at /p/42",
                       "--external-id", "42", now=clock.now)
    assert (code, out) == (0, f"{rid} is now succeeded (was manual_review)\n")
    code, out, _ = cli(capsys, "--db", str(path), "show", rid, "--json", now=clock.now)
    data = json.loads(out)
    assert (data["state"], data["external_id"], data["updated_at"]) == ("succeeded", "42", at(minutes=10))
    assert data["events"][-1] == {**data["events"][-1], "from_state": "manual_review", "to_state": "succeeded",
                                  "actor": "cli:alice", "reason": "resolved by hand: live at /p/42"}


def test_resolve_safe_to_retry_lets_the_next_identical_request_through(review, capsys, alice):
    path, ids, clock, store = review
    rid = ids["outcome_unknown"]
    assert store.begin_attempt(attempt(1)).kind == "blocked"
    code, _, _ = cli(capsys, "--db", str(path), "resolve", rid, "--as", "safe_to_retry", "--note", "not there")
    assert code == 0
    decision = store.begin_attempt(attempt(1))
    assert (decision.kind, decision.receipt.retry_of) == ("forward", rid)


def test_resolve_actor_without_a_login_name(review, capsys, monkeypatch):
    path, ids, _, store = review

    def no_login():
        raise OSError("No username set in the environment")

    monkeypatch.setattr(getpass, "getuser", no_login)
    code, _, _ = cli(capsys, "--db", str(path), "resolve", ids["manual_review"], "--as", "rejected", "--note", "refused")
    assert code == 0
    assert store.events(ids["manual_review"])[-1].actor == "cli"


@pytest.mark.parametrize(
    "target, argv, needles",
    [
        pytest.param("unknown", ["--as", "succeeded", "--note", "x"], [UNKNOWN_ID], id="unknown-id"),
        pytest.param("succeeded", ["--as", "safe_to_retry", "--note", "x"], ["is succeeded", "outcome_unknown"],
                     id="already-succeeded"),
        pytest.param("rejected", ["--as", "succeeded", "--note", "x"], ["is rejected"], id="already-rejected"),
        pytest.param("submitted", ["--as", "succeeded", "--note", "x"], ["is submitted"], id="still-submitted"),
        pytest.param("reconciling", ["--as", "succeeded", "--note", "x"], ["is reconciling"], id="reconciling"),
        pytest.param("manual_review", ["--as", "succeeded", "--note", ""], ["--note"], id="empty-note"),
        pytest.param("outcome_unknown", ["--as", "succeeded", "--note", " \t "], ["--note"], id="blank-note"),
        pytest.param("outcome_unknown", ["--as", "rejected", "--note", "x", "--external-id", "9"],
                     ["--external-id", "--as succeeded"], id="external-id-without-succeeded"),
    ],
)
def test_resolve_errors_write_nothing(review, capsys, alice, target, argv, needles):
    path, ids, clock, _ = review
    rid = ids.get(target, UNKNOWN_ID)
    before = dump(path)
    code, out, err = cli(capsys, "--db", str(path), "resolve", rid, *argv, now=clock.now)
    assert_one_line_error(code, out, err, *needles)
    assert dump(path) == before


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--as", "succeded", "--note", "x"], "argument --as: invalid choice: 'succeded'", id="bad-as"),
        pytest.param(["--as", "manual_review", "--note", "x"], "argument --as: invalid choice", id="not-a-resolution"),
        pytest.param(["--as", "succeeded"], "the following arguments are required: --note", id="no-note"),
        pytest.param(["--note", "x"], "the following arguments are required: --as", id="no-as"),
    ],
)
def test_resolve_usage_errors_write_nothing(review, capsys, argv, message):
    path, ids, _, _ = review
    before = dump(path)
    with pytest.raises(SystemExit) as e:
        main(["--db", str(path), "resolve", ids["outcome_unknown"], *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert dump(path) == before


# --- reconcile ----------------------------------------------------------------------------

KEY_ENV = "RECEIPTS_TEST_API_KEY"
RECONCILE_RULES = f"""\
api: test-api
hosts: [127.0.0.1]
credentials: {{header: api-key, env: {KEY_ENV}}}
operations:
  things.create:
    description: A complete list, so "not found" proves absence
    match: {{method: POST, path: "/api/{{bucket}}/things"}}
    fingerprint: {{body: [title]}}
    external_id: id
    reconcile:
      read: {{method: GET, url: "/api/{{path.bucket}}/things"}}
      find: {{title: "{{intent.title}}"}}
      absence_provable: true
      retry_when_absent: true
  notes.create:
    description: A list that may be paginated, so "not found" proves nothing
    match: {{method: POST, path: "/api/{{bucket}}/notes"}}
    fingerprint: {{body: [title]}}
    external_id: id
    reconcile:
      read: {{url: "/api/{{path.bucket}}/notes"}}
      find: {{title: "{{intent.title}}"}}
  drafts.create:
    description: A complete list, but a retry needs a human's word
    match: {{method: POST, path: "/api/{{bucket}}/drafts"}}
    fingerprint: {{body: [title]}}
    external_id: id
    reconcile:
      read: {{url: "/api/{{path.bucket}}/drafts"}}
      find: {{title: "{{intent.title}}"}}
      absence_provable: true
  lookups.create:
    description: One item, by its title (a number here); the read's status decides
    match: {{method: POST, path: "/api/{{bucket}}/lookups"}}
    fingerprint: {{body: [title]}}
    external_id: id
    reconcile:
      read: {{url: "/api/{{path.bucket}}/lookups/{{intent.title}}"}}
      absence_provable: true
      retry_when_absent: true
  plain.create:
    description: No reconcile spec
    match: {{method: POST, path: "/api/{{bucket}}/plain"}}
    fingerprint: {{body: [title]}}
    external_id: id
  slow.create:
    description: A search index that lags its writes by up to ten minutes
    match: {{method: POST, path: "/api/{{bucket}}/slow"}}
    fingerprint: {{body: [title]}}
    external_id: id
    reconcile:
      read: {{url: "/api/{{path.bucket}}/slow"}}
      find: {{title: "{{intent.title}}"}}
      absence_provable: true
      settle: 10m
      retry_when_absent: true
"""
RECONCILING_REASON = "reconciling with a read"


@dataclass
class Recon:
    """
    A writable receipts database, a rules file and a real upstream the reads go to. The
    upstream is shared by the module (stopping one takes 50 ms); each test has its own bucket,
    /api/<bucket>/<kind>, and counts only the requests to it.
    """

    path: Path
    rules: Path
    store: Store
    clock: FakeClock
    up: Upstream
    bucket: str

    def api_path(self, kind: str) -> str:
        return f"/api/{self.bucket}/{kind}"

    def attempt(self, title: str, *, kind: str = "things", api: str = "test-api",
                operation: str | None = None) -> Attempt:
        """A POST to <upstream>/api/<bucket>/<kind> with the body {"title": title}."""
        return Attempt(api=api, operation=operation or f"{kind}.create", method="POST",
                       target=f"{self.up.url}{self.api_path(kind)}", intent_fingerprint=f"sha256:{api}/{kind}/{title}",
                       intent={"path": {"bucket": self.bucket}, "body": {"title": title}}, principal="anonymous",
                       flow_id=f"flow-{title}")

    def receipt(self, title: str, *, kind: str = "things", state: State = State.OUTCOME_UNKNOWN,
                api: str = "test-api", operation: str | None = None) -> str:
        """The receipt of `attempt(...)`, moved to `state`."""
        attempt = self.attempt(title, kind=kind, api=api, operation=operation)
        if state is State.AWAITING_APPROVAL:  # created as one: its operation needs approval
            attempt = dataclasses.replace(attempt, approval=True)
        rid = self.store.begin_attempt(attempt).receipt.operation_id
        steps = {
            State.AWAITING_APPROVAL: [], State.SUBMITTED: [], State.SUCCEEDED: [State.SUCCEEDED], State.REJECTED: [State.REJECTED],
            State.NOT_SENT: [State.NOT_SENT], State.OUTCOME_UNKNOWN: [State.OUTCOME_UNKNOWN],
            State.MANUAL_REVIEW: [State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW],
            State.SAFE_TO_RETRY: [State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW, State.SAFE_TO_RETRY],
            State.RECONCILING: [State.OUTCOME_UNKNOWN, State.RECONCILING],
        }[state]
        for s in steps:
            if s is State.RECONCILING:
                self.store.claim_for_reconcile(rid, actor="another-reconciler")
            else:
                self.store.transition(rid, s, reason=f"to {s}")
        assert self.store.get(rid).state == state
        return rid

    def add(self, kind: str, *titles: str) -> None:
        """Create items on the upstream with real POSTs, as if earlier writes had taken effect."""
        for title in titles:  # a connection each: keep-alive would wait on delayed ACKs
            conn = http.client.HTTPConnection("127.0.0.1", self.up.port, timeout=5)
            try:
                conn.request("POST", self.api_path(kind), json.dumps({"title": title}),
                             {"Content-Type": "application/json"})
                r = conn.getresponse()
                assert (r.status, json.loads(r.read())["id"]) == (201, self.up.commits(self.api_path(kind)))
            finally:
                conn.close()

    def read_of(self, kind: str) -> str:
        return f"read GET {self.up.url}{self.api_path(kind)}"

    def requests(self) -> list[dict]:
        """What reached this test's bucket on the upstream."""
        with self.up.lock:
            return [q for q in self.up.requests if q["path"].startswith(f"/api/{self.bucket}/")]

    def gets(self) -> list[dict]:
        return [q for q in self.requests() if q["method"] in ("GET", "HEAD")]

    def reads(self, kind: str) -> int:
        return self.up.reads(self.api_path(kind))

    def db_bytes(self) -> bytes:
        return b"".join(p.read_bytes() for p in (self.path, Path(f"{self.path}-wal")) if p.exists())

    def run(self, capsys, *argv: str, rules: bool = True) -> tuple[int, str, str]:
        """`receipts reconcile --rules <ours> ARGV`; a later --rules in ARGV wins."""
        pre = ["--rules", str(self.rules)] if rules else []
        return cli(capsys, "--db", str(self.path), "reconcile", *pre, *argv, now=self.clock.now)


@pytest.fixture(scope="module")
def reads_upstream():
    with Upstream() as up:
        yield up


@pytest.fixture
def recon(tmp_path, monkeypatch, alice, reads_upstream):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv("RECEIPT_PROXY_RULES", raising=False)
    rules = tmp_path / "test-api.yaml"
    rules.write_text(RECONCILE_RULES)
    clock = FakeClock()
    store = Store.open(tmp_path / "receipts.db", clock=clock)
    yield Recon(tmp_path / "receipts.db", rules, store, clock, reads_upstream, uuid.uuid4().hex[:12])
    store.close()


def history(store: Store, rid: str) -> list[tuple[str | None, str, str, str]]:
    return [(e.from_state, e.to_state, e.reason, e.actor) for e in store.events(rid)]


# Each case: the receipt's kind (/api/<bucket>/<kind>, operation <kind>.create) and title, the
# titles already on the upstream, a fault for the read, more argv, the receipt's (api, operation)
# when not the kind's, then the expected state, external id and reason ({read} is "read GET <url>"),
# and the read's path after /api/<bucket>/<kind> (None: no read is sent).
RECONCILE_CASES = [
    pytest.param("things", "x", ["a", "x", "b"], None, [], None, "succeeded", "2",
                 "{read} → HTTP 200: found among 3 items (id=2)", "", id="found"),
    pytest.param("notes", "x", ["x"], None, [], None, "succeeded", "1",
                 "{read} → HTTP 200: found among 1 items (id=1)", "", id="found-in-a-list-that-proves-nothing-absent"),
    pytest.param("things", "x", ["a", "b"], None, [], None, "safe_to_retry", None,
                 "{read} → HTTP 200: not found among 2 items; absence is proven and the rule allows a retry", "",
                 id="absent-provable"),
    pytest.param("things", "x", [], None, [], None, "safe_to_retry", None,
                 "{read} → HTTP 200: not found among 0 items; absence is proven and the rule allows a retry", "",
                 id="absent-from-an-empty-list"),
    pytest.param("notes", "x", ["a"], None, [], None, "manual_review", None,
                 "{read} → HTTP 200: not found among 1 items; the rule does not say this read proves absence", "",
                 id="absent-not-provable"),
    pytest.param("drafts", "x", ["a"], None, [], None, "manual_review", None,
                 "{read} → HTTP 200: not found among 1 items; the rule does not allow a retry", "",
                 id="absent-provable-but-no-retry-allowed"),
    pytest.param("things", "x", ["x"], "500", [], None, "manual_review", None,
                 "{read} → HTTP 500: the read failed, nothing is proven", "", id="read-answers-500"),
    pytest.param("things", "x", ["x"], "404", [], None, "manual_review", None,
                 "{read} → HTTP 404: the read failed, nothing is proven", "", id="list-read-answers-404"),
    pytest.param("things", "x", ["x"], "hang", ["--timeout", "0.1"], None, "manual_review", None,
                 "read failed: timed out", "", id="read-times-out"),
    pytest.param("lookups", "2", ["a", "b"], None, [], None, "succeeded", "2",
                 "{read} → HTTP 200: found", "/2", id="status-decides-found"),
    pytest.param("lookups", "3", ["a", "b"], None, [], None, "safe_to_retry", None,
                 "{read} → HTTP 404; absence is proven and the rule allows a retry", "/3", id="status-decides-absent"),
    pytest.param("lookups", "2", ["a", "b"], "500", [], None, "manual_review", None,
                 "{read} → HTTP 500: the read failed, nothing is proven", "/2", id="status-decides-500"),
    pytest.param("plain", "x", ["x"], None, [], None, "manual_review", None,
                 "no read can decide: test-api plain.create has no reconcile spec", None, id="no-reconcile-spec"),
    pytest.param("things", "x", ["x"], None, [], ("test-api", "things.archive"), "manual_review", None,
                 "no read can decide: its rule is gone", None, id="operation-gone-from-the-rules"),
    pytest.param("things", "x", ["x"], None, [], ("gone-api", "things.create"), "manual_review", None,
                 "no read can decide: its rule is gone", None, id="api-gone-from-the-rules"),
]


@pytest.mark.parametrize("start", [State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW], ids=str)
@pytest.mark.parametrize("kind, title, items, fault, argv, rule, state, external_id, reason, read", RECONCILE_CASES)
def test_reconcile(recon, capsys, start, kind, title, items, fault, argv, rule, state, external_id, reason, read):
    recon.add(kind, *items)
    api, operation = rule or ("test-api", f"{kind}.create")
    rid = recon.receipt(title, kind=kind, state=start, api=api, operation=operation)
    read_path = None if read is None else recon.api_path(kind) + read
    if fault:
        recon.up.plan_read(read_path, fault)
    before = history(recon.store, rid)
    reason = reason.format(read=f"read GET {recon.up.url}{read_path}")
    code, out, err = recon.run(capsys, rid, *argv)
    assert (code, err) == (0, "")  # one receipt: no progress lines
    assert out == f"{rid}  {start} → {state}  {reason}\n"
    r = recon.store.get(rid)
    assert (r.state, r.external_id) == (state, external_id)
    assert history(recon.store, rid) == before + [
        (start, "reconciling", RECONCILING_REASON, "cli:alice"), ("reconciling", state, reason, "cli:alice")]
    assert [(q["method"], q["path"]) for q in recon.gets()] == ([] if read is None else [("GET", read_path)])
    assert recon.up.seen(recon.api_path(kind)) == len(items)  # a read, never another write
    assert len(recon.requests()) == len(items) + (read is not None)


def test_reconcile_safe_to_retry_lets_the_next_identical_request_through(recon, capsys):
    rid = recon.receipt("x")
    attempt_again = recon.attempt("x")
    assert recon.store.begin_attempt(attempt_again).kind == "blocked"
    code, _, _ = recon.run(capsys, rid)
    assert (code, recon.store.get(rid).state) == (0, "safe_to_retry")
    decision = recon.store.begin_attempt(attempt_again)
    assert (decision.kind, decision.receipt.retry_of) == ("forward", rid)


def test_reconcile_json(recon, capsys):
    recon.add("things", "a", "x")
    found = recon.receipt("x")
    unproven = recon.receipt("y", kind="notes", state=State.MANUAL_REVIEW)
    code, out, err = recon.run(capsys, found, unproven, "--json")
    assert code == 0
    assert err == (f"[1/2] {found} test-api/things.create ...\n"
                   f"[2/2] {unproven} test-api/notes.create ...\n")
    results = json.loads(out)
    assert results == [
        {"operation_id": found, "operation": "test-api/things.create", "from": "outcome_unknown",
         "state": "succeeded", "external_id": "2",
         "reason": f"{recon.read_of('things')} → HTTP 200: found among 2 items (id=2)"},
        {"operation_id": unproven, "operation": "test-api/notes.create", "from": "manual_review",
         "state": "manual_review", "external_id": None,
         "reason": f"{recon.read_of('notes')} → HTTP 200: not found among 0 items; "
                   "the rule does not say this read proves absence"},
    ]
    for result in results:  # what was printed is what was recorded
        r = recon.store.get(result["operation_id"])
        assert (r.state, r.external_id) == (result["state"], result["external_id"])
        assert recon.store.events(r.operation_id)[-1].reason == result["reason"]
    assert (recon.reads("things"), recon.reads("notes"), len(recon.gets())) == (1, 1, 2)


def test_reconcile_several_ids_in_text(recon, capsys):
    recon.add("things", "x")
    first, second = recon.receipt("x"), recon.receipt("y")
    code, out, err = recon.run(capsys, second, first)  # in the order given
    assert code == 0
    assert err == (f"[1/2] {second} test-api/things.create ...\n"
                   f"[2/2] {first} test-api/things.create ...\n")
    read = recon.read_of("things")
    assert out == (
        f"{second}  outcome_unknown → safe_to_retry  {read} → HTTP 200: not found among 1 items; "
        "absence is proven and the rule allows a retry\n"
        f"{first}  outcome_unknown → succeeded  {read} → HTTP 200: found among 1 items (id=1)\n"
    )
    assert recon.reads("things") == 2


SECRET_HEADER = "SECRET-HEADER-9d1c44"
SECRET_ENV = "SECRET-ENV-7ab302"


@pytest.mark.parametrize(
    "argv, env, sent",
    [
        pytest.param([], None, {}, id="none"),
        pytest.param(["--header", f"api-key: {SECRET_HEADER}"], None, {"api-key": SECRET_HEADER}, id="header"),
        pytest.param(["--header", f"  API-Key :  {SECRET_HEADER}  "], None, {"api-key": SECRET_HEADER},
                     id="header-name-case-and-spaces"),
        pytest.param(["--header", f"api-key: {SECRET_HEADER}", "--header", "Authorization: Bearer SECRET-BEARER-1"],
                     None, {"api-key": SECRET_HEADER, "authorization": "Bearer SECRET-BEARER-1"}, id="two-headers"),
        pytest.param([], SECRET_ENV, {"api-key": SECRET_ENV}, id="env-named-by-credentials.env"),
        pytest.param(["--header", f"api-key: {SECRET_HEADER}"], SECRET_ENV, {"api-key": SECRET_HEADER},
                     id="header-beats-env"),
        pytest.param(["--header", "Authorization: Bearer SECRET-BEARER-1"], SECRET_ENV,
                     {"authorization": "Bearer SECRET-BEARER-1"}, id="any-header-replaces-env"),
        pytest.param([], "", {}, id="empty-env"),
    ],
)
def test_reconcile_credentials_are_sent_and_never_stored(recon, capsys, monkeypatch, argv, env, sent):
    if env is not None:
        monkeypatch.setenv(KEY_ENV, env)
    recon.add("things", "x")
    rid = recon.receipt("x")
    code, out, err = recon.run(capsys, rid, *argv)
    assert (code, err) == (0, "")
    assert recon.store.get(rid).state == "succeeded"
    [read] = recon.gets()
    headers = {k.lower(): v for k, v in read["headers"].items()}
    assert {k: headers[k] for k in ("api-key", "authorization") if k in headers} == sent
    stored = recon.db_bytes()
    assert b"test-api" in stored and rid.encode() in stored  # the bytes read are the database's
    for secret in ("SECRET-", SECRET_HEADER, SECRET_ENV):
        assert secret.encode() not in stored
        assert secret not in out
    assert (SECRET_ENV in headers.values()) == (SECRET_ENV in sent.values())


def test_reconcile_all(recon, capsys):
    recon.add("things", "found")
    ids = {}
    ids["unknown_found"] = recon.receipt("found")
    ids["review_absent"] = recon.receipt("absent", state=State.MANUAL_REVIEW)
    ids["unknown_unproven"] = recon.receipt("unproven", kind="notes")
    for s in (State.SUCCEEDED, State.SUBMITTED, State.REJECTED, State.NOT_SENT, State.SAFE_TO_RETRY,
              State.RECONCILING):
        ids[str(s)] = recon.receipt(f"other-{s}", state=s)
    # one already there under the title found: a read would find it
    untouched = {k: v for k, v in ids.items() if k not in ("unknown_found", "review_absent", "unknown_unproven")}
    receipts_before, events_before = dump(recon.path)
    code, out, err = recon.run(capsys, "--all")
    assert code == 0
    order = [ids["unknown_unproven"], ids["review_absent"], ids["unknown_found"]]  # newest first
    ops = ["test-api/notes.create", "test-api/things.create", "test-api/things.create"]
    assert err == "".join(f"[{n}/3] {rid} {op} ...\n" for n, (rid, op) in enumerate(zip(order, ops), 1))
    things, notes = recon.read_of("things"), recon.read_of("notes")
    assert out.splitlines() == [
        f"{order[0]}  outcome_unknown → manual_review  {notes} → HTTP 200: not found among 0 items; "
        "the rule does not say this read proves absence",
        f"{order[1]}  manual_review → safe_to_retry  {things} → HTTP 200: not found among 1 items; "
        "absence is proven and the rule allows a retry",
        f"{order[2]}  outcome_unknown → succeeded  {things} → HTTP 200: found among 1 items (id=1)",
    ]
    receipts_after, events_after = dump(recon.path)
    assert [r for r in receipts_after if r[0] in untouched.values()] == [
        r for r in receipts_before if r[0] in untouched.values()]
    assert events_after[:len(events_before)] == events_before
    assert sorted(e[1] for e in events_after[len(events_before):]) == sorted(order * 2)  # two events each
    assert (recon.reads("things"), recon.reads("notes"), len(recon.gets())) == (2, 1, 3)
    # Again: only the receipt still in manual_review is read again, alone (no progress line).
    code, out, err = recon.run(capsys, "--all")
    assert (code, err) == (0, "")
    assert out == (f"{order[0]}  manual_review → manual_review  {notes} → HTTP 200: not found among 0 items; "
                   "the rule does not say this read proves absence\n")
    assert (recon.reads("notes"), len(recon.gets())) == (2, 4)


@pytest.mark.parametrize("json_flag, expected", [
    pytest.param([], "nothing to reconcile: no outcome_unknown or manual_review receipts\n", id="text"),
    pytest.param(["--json"], "[]\n", id="json"),
])
def test_reconcile_all_with_nothing_to_do(recon, capsys, json_flag, expected):
    recon.receipt("done", state=State.SUCCEEDED)
    recon.receipt("in-flight", state=State.SUBMITTED)
    before = dump(recon.path)
    code, out, err = recon.run(capsys, "--all", *json_flag)
    assert (code, out, err) == (0, expected, "")
    assert dump(recon.path) == before
    assert recon.requests() == []


def test_reconcile_rules_from_the_environment_and_by_default(recon, capsys, monkeypatch, tmp_path):
    recon.add("things", "x")
    first, second, third = recon.receipt("x"), recon.receipt("y"), recon.receipt("z")
    monkeypatch.setenv("RECEIPT_PROXY_RULES", str(recon.rules))
    code, out, _ = recon.run(capsys, first, rules=False)
    assert code == 0 and "outcome_unknown → succeeded" in out
    monkeypatch.setenv("RECEIPT_PROXY_RULES", str(tmp_path / "missing.yaml"))
    code, out, _ = recon.run(capsys, second)  # --rules beats the environment
    assert code == 0 and "outcome_unknown → safe_to_retry" in out
    monkeypatch.delenv("RECEIPT_PROXY_RULES")
    assert load_rules_path(DEFAULT_RULES).operation("test-api", "things.create") is None  # rules/ knows no test-api
    code, out, _ = recon.run(capsys, third, rules=False)
    assert (code, out) == (0, f"{third}  outcome_unknown → manual_review  no read can decide: its rule is gone\n")
    assert recon.reads("things") == 2


@pytest.mark.parametrize("settled_first", [False, True], ids=["settled-last", "settled-first"])
def test_reconcile_a_settled_receipt_among_others_fails_only_itself(recon, capsys, settled_first):
    recon.add("things", "x")
    found, done = recon.receipt("x"), recon.receipt("done", state=State.SUCCEEDED)
    done_before = [r for r in dump(recon.path)[0] if r[0] == done]
    order = [done, found] if settled_first else [found, done]
    code, out, err = recon.run(capsys, *order)
    assert code == 1
    assert out.startswith(f"{found}  outcome_unknown → succeeded  ") and out.count("\n") == 1
    error = f"Error: receipt {done} is succeeded; succeeded → reconciling is not allowed"
    progress = [f"[{n}/2] {rid} test-api/things.create ..." for n, rid in enumerate(order, 1)]
    assert err.splitlines() == ([progress[0], error, progress[1]] if settled_first else [*progress, error])
    assert recon.store.get(found).state == "succeeded"
    assert [r for r in dump(recon.path)[0] if r[0] == done] == done_before
    assert recon.reads("things") == 1


RECONCILE_ERRORS = [
    pytest.param(["{unknown}"], ["{unknown}"], id="unknown-id"),
    pytest.param(["{outcome_unknown}", "{unknown}"], ["{unknown}"], id="a-known-and-an-unknown-id"),
    pytest.param([], ["--all"], id="neither-ids-nor-all"),
    pytest.param(["{outcome_unknown}", "--all"], ["--all"], id="ids-and-all"),
    pytest.param(["{outcome_unknown}", "--header", "nocolon"], ["--header", "'nocolon'"], id="header-without-colon"),
    pytest.param(["{outcome_unknown}", "--header", " : v"], ["--header"], id="header-without-name"),
    pytest.param(["{outcome_unknown}", "--header", "api-key: v", "--header", "nocolon"], ["'nocolon'"],
                 id="second-header-bad"),
    pytest.param(["--all", "--header", "nocolon"], ["'nocolon'"], id="bad-header-with-all"),
    pytest.param(["{outcome_unknown}", "--header", "api key: v"], ["--header", "api key"], id="header-name-with-space"),
    pytest.param(["{outcome_unknown}", "--rules", "{tmp}/missing.yaml"], ["--rules", "missing.yaml", "no such rules"],
                 id="missing-rules-file"),
    pytest.param(["--all", "--rules", "{tmp}/no-rules-here"], ["--rules", "no-rules-here", "no *.yaml"],
                 id="rules-folder-without-yaml"),
    pytest.param(["{outcome_unknown}", "--rules", "{tmp}/broken.yaml"], ["--rules", "broken.yaml"],
                 id="malformed-rules-file"),
    pytest.param(["{succeeded}"], ["{succeeded}", "is succeeded"], id="already-succeeded"),
    pytest.param(["{rejected}"], ["{rejected}", "is rejected"], id="already-rejected"),
    pytest.param(["{safe_to_retry}"], ["{safe_to_retry}", "is safe_to_retry"], id="already-safe_to_retry"),
    pytest.param(["{submitted}"], ["{submitted}", "is submitted"], id="still-submitted"),
    pytest.param(["{reconciling}"], ["{reconciling}", "is reconciling"], id="being-reconciled"),
]


@pytest.mark.parametrize("argv, needles", RECONCILE_ERRORS)
def test_reconcile_errors_write_nothing_and_read_nothing(recon, capsys, tmp_path, argv, needles):
    (tmp_path / "no-rules-here").mkdir()
    (tmp_path / "broken.yaml").write_text("api: test-api\nhosts: [127.0.0.1]\noperations: {x: {match: 3}}\n")
    ids = {str(s): recon.receipt(str(s), state=s) for s in State}
    values = {**ids, "unknown": UNKNOWN_ID, "tmp": str(tmp_path)}
    before = dump(recon.path)
    code, out, err = recon.run(capsys, *(a.format(**values) for a in argv))
    assert_one_line_error(code, out, err, *(n.format(**values) for n in needles))
    assert dump(recon.path) == before
    assert recon.gets() == []


def test_reconcile_usage_errors(recon, capsys):
    rid = recon.receipt("x")
    before = dump(recon.path)
    for argv, message in [(["--timeout", "soon"], "argument --timeout: "),
                          (["--header"], "argument --header: expected one argument")]:
        with pytest.raises(SystemExit) as e:
            main(["--db", str(recon.path), "reconcile", rid, *argv])
        assert e.value.code == 2
        assert message in capsys.readouterr().err
    assert dump(recon.path) == before
    assert recon.gets() == []


# Values that once reached httpx unchecked (a traceback after the claim, or a credential in the DB).


def run_expecting_refusal(recon: Recon, capsys, *argv: str) -> tuple[int, str, str]:
    """Run reconcile; an argparse refusal (exit 2) or an `Error:` line (exit 1) are both a refusal."""
    try:
        return recon.run(capsys, *argv)
    except SystemExit as e:
        out, err = capsys.readouterr()
        return e.code, out, err


@pytest.mark.parametrize("timeout", ["-1", "nan", "inf", "0"])
def test_reconcile_bad_timeout_is_refused_before_any_read(recon, capsys, timeout):
    recon.add("things", "x")
    rid = recon.receipt("x")
    before = dump(recon.path)
    code, out, err = run_expecting_refusal(recon, capsys, rid, f"--timeout={timeout}")
    assert code in (1, 2) and out == "" and "--timeout" in err
    assert dump(recon.path) == before
    assert recon.store.get(rid).state == "outcome_unknown"
    assert recon.gets() == []


@pytest.mark.parametrize("argv, env", [
    pytest.param(["--header", "api-key: SECRET-caf\u00e9"], None, id="header"),
    pytest.param([], "SECRET-caf\u00e9", id="env"),
])
def test_reconcile_unsendable_credential_is_a_one_line_error(recon, capsys, monkeypatch, argv, env):
    if env is not None:
        monkeypatch.setenv(KEY_ENV, env)
    rid = recon.receipt("x")
    before = dump(recon.path)
    code, out, err = recon.run(capsys, rid, *argv)
    assert_one_line_error(code, out, err)
    assert "SECRET-" not in err
    assert dump(recon.path) == before
    assert recon.gets() == []


@pytest.mark.parametrize("argv, env", [
    pytest.param([], "SECRET-CR-3f9a\r", id="env-with-a-trailing-CR"),
    pytest.param(["--header", "api-key: SECRET-LF-1\nSECRET-LF-2"], None, id="header-with-a-line-break"),
])
def test_reconcile_credential_with_a_line_break_never_reaches_the_db(recon, capsys, monkeypatch, argv, env):
    if env is not None:
        monkeypatch.setenv(KEY_ENV, env)
    recon.add("things", "x")
    rid = recon.receipt("x")
    before = dump(recon.path)
    code, out, err = recon.run(capsys, rid, *argv)
    assert b"SECRET-" not in recon.db_bytes(), "the credential is in the database"
    assert "SECRET-" not in out + err
    assert dump(recon.path) == before  # no "read" that never left recorded as one


# --- prune --------------------------------------------------------------------------------


@pytest.fixture
def aged(tmp_path):
    """
    Receipts last changed 40 days ago in every state, one chain of retries whose newest
    attempt is unresolved, one whose attempts are all resolved, and a recent success.
    """
    path = tmp_path / "receipts.db"
    clock = FakeClock()
    store = Store.open(path, clock=clock)
    ids = {}

    def new(n: int, *steps: State) -> str:
        rid = store.begin_attempt(attempt(n)).receipt.operation_id
        for s in steps:
            store.transition(rid, s, reason=f"to {s}")
        return rid

    ids["old_succeeded"] = new(1, State.SUCCEEDED)
    ids["old_rejected"] = new(2, State.REJECTED)
    ids["old_safe_to_retry"] = new(3, State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW, State.SAFE_TO_RETRY)
    ids["old_not_sent"] = new(4, State.NOT_SENT)
    ids["old_submitted"] = new(5)
    ids["old_outcome_unknown"] = new(6, State.OUTCOME_UNKNOWN)
    ids["old_manual_review"] = new(7, State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW)
    ids["old_reconciling"] = new(8, State.OUTCOME_UNKNOWN, State.RECONCILING)
    ids["old_parent_of_unresolved"] = new(9, State.NOT_SENT)   # its retry below is unresolved
    ids["old_parent_of_resolved"] = new(10, State.NOT_SENT)    # its retry below is resolved too
    ids["old_resolved_retry"] = new(10, State.SUCCEEDED)
    clock.advance(86400)
    ids["unresolved_retry"] = new(9, State.OUTCOME_UNKNOWN)    # T0+1d, retry_of old_parent_of_unresolved
    clock.now = T0 + dt.timedelta(days=35)
    ids["recent_succeeded"] = new(11, State.SUCCEEDED)
    assert store.get(ids["unresolved_retry"]).retry_of == ids["old_parent_of_unresolved"]
    assert store.get(ids["old_resolved_retry"]).retry_of == ids["old_parent_of_resolved"]
    clock.now = T0 + dt.timedelta(days=40)
    yield path, ids, clock, store
    store.close()


PRUNED = {"old_succeeded", "old_rejected", "old_safe_to_retry", "old_not_sent", "old_parent_of_resolved",
          "old_resolved_retry"}


def test_prune_deletes_old_resolved_receipts_only(aged, capsys):
    path, ids, clock, store = aged
    before = dump(path)
    code, out, err = cli(capsys, "--db", str(path), "prune", "--older-than", "30d", now=clock.now)
    assert (code, err) == (0, "")
    assert out == "deleted 6 resolved receipts last changed more than 30d ago\n"
    receipts, events = dump(path)
    assert {r[0] for r in receipts} == {ids[k] for k in set(ids) - PRUNED}
    gone = {ids[k] for k in PRUNED}
    assert {e[1] for e in events} == {ids[k] for k in set(ids) - PRUNED}  # their events went with them
    assert receipts == [r for r in before[0] if r[0] not in gone]  # the kept ones are untouched
    assert events == [e for e in before[1] if e[1] not in gone]
    code, out, _ = cli(capsys, "--db", str(path), "list", "--json", now=clock.now)
    assert {r["operation_id"]: r["state"] for r in json.loads(out)} == {
        ids["old_submitted"]: "submitted", ids["old_outcome_unknown"]: "outcome_unknown",
        ids["old_manual_review"]: "manual_review", ids["old_reconciling"]: "reconciling",
        ids["old_parent_of_unresolved"]: "not_sent", ids["unresolved_retry"]: "outcome_unknown",
        ids["recent_succeeded"]: "succeeded",
    }
    code, out, err = cli(capsys, "--db", str(path), "show", ids["old_succeeded"], now=clock.now)
    assert_one_line_error(code, out, err, ids["old_succeeded"])
    code, out, _ = cli(capsys, "--db", str(path), "prune", "--older-than", "30d", now=clock.now)
    assert (code, out) == (0, "deleted 0 resolved receipts last changed more than 30d ago\n")


def test_prune_dry_run_deletes_nothing(aged, capsys):
    path, ids, clock, _ = aged
    before = dump(path)
    code, out, _ = cli(capsys, "--db", str(path), "prune", "--older-than", "30d", "--dry-run", now=clock.now)
    assert (code, out) == (0, "would delete 6 resolved receipts last changed more than 30d ago\n")
    assert dump(path) == before


def test_prune_never_deletes_unresolved_receipts_even_at_age_zero(aged, capsys):
    path, ids, clock, _ = aged
    clock.now = T0 + dt.timedelta(days=400)
    code, out, _ = cli(capsys, "--db", str(path), "prune", "--older-than", "0s", now=clock.now)
    assert (code, out) == (0, "deleted 7 resolved receipts last changed more than 0s ago\n")
    assert {r[0]: r[5] for r in dump(path)[0]} == {
        ids["old_submitted"]: "submitted", ids["old_outcome_unknown"]: "outcome_unknown",
        ids["old_manual_review"]: "manual_review", ids["old_reconciling"]: "reconciling",
        ids["unresolved_retry"]: "outcome_unknown",
        ids["old_parent_of_unresolved"]: "not_sent",  # still the ancestor of an unresolved retry
    }


@pytest.mark.parametrize(
    "older_than, expected",
    [
        pytest.param("1m", [0, 1, 11], id="1m"),
        pytest.param("90m", [0, 1], id="90m"),
        pytest.param("11h", [0], id="11h-boundary-excluded"),
        pytest.param("12h", [], id="12h"),
        pytest.param("30d", [], id="30d"),
    ],
)
@pytest.mark.parametrize("dry_run", [False, True], ids=["delete", "dry-run"])
def test_prune_ages(tmp_path, capsys, older_than, expected, dry_run):
    path = tmp_path / "receipts.db"
    clock = FakeClock()
    store = Store.open(path, clock=clock)
    ids = {}
    for hours in (0, 1, 11):  # succeeded at T0, T0+1h, T0+11h
        clock.now = T0 + dt.timedelta(hours=hours)
        ids[hours] = store.begin_attempt(attempt(hours)).receipt.operation_id
        store.transition(ids[hours], State.SUCCEEDED, reason="HTTP 201")
    store.close()
    now = T0 + dt.timedelta(hours=12)
    argv = ["--db", str(path), "prune", "--older-than", older_than] + (["--dry-run"] if dry_run else [])
    code, out, _ = cli(capsys, *argv, now=now)
    noun = "receipt" if len(expected) == 1 else "receipts"
    verb = "would delete" if dry_run else "deleted"
    assert (code, out) == (0, f"{verb} {len(expected)} resolved {noun} last changed more than {older_than} ago\n")
    remaining = {r[0] for r in dump(path)[0]}
    assert remaining == (set(ids.values()) if dry_run else {ids[h] for h in ids if h not in expected})


@pytest.mark.parametrize("older_than", ["30", "d", "-5d", "30 days", "1.5d", "30y", "", "99999999999d"])
def test_prune_bad_older_than_writes_nothing(aged, capsys, older_than):
    path, _, clock, _ = aged
    before = dump(path)
    code, out, err = cli(capsys, "--db", str(path), "prune", f"--older-than={older_than}", now=clock.now)
    assert_one_line_error(code, out, err, "--older-than", repr(older_than))
    assert dump(path) == before


def test_prune_needs_older_than(aged, capsys):
    path, _, _, _ = aged
    before = dump(path)
    with pytest.raises(SystemExit) as e:
        main(["--db", str(path), "prune"])
    assert e.value.code == 2
    assert "the following arguments are required: --older-than" in capsys.readouterr().err
    assert dump(path) == before


# --- the database -------------------------------------------------------------------------

EVERY_COMMAND = [
    pytest.param(["list"], id="list"),
    pytest.param(["show", "x"], id="show"),
    pytest.param(["blocked"], id="blocked"),
    pytest.param(["resolve", "x", "--as", "succeeded", "--note", "n"], id="resolve"),
    pytest.param(["reconcile", "--all"], id="reconcile"),
    pytest.param(["export"], id="export"),
    pytest.param(["prune", "--older-than", "1d"], id="prune"),
]


def test_every_command_has_a_test_of_a_missing_db():
    assert {p.values[0][0] for p in EVERY_COMMAND} == {name for name, c in COMMANDS.items() if c.uses_store}


def test_rules_commands_need_no_db(tmp_path, capsys):
    """`receipts rules` reads rules files only: a missing database is neither an error nor created."""
    missing = tmp_path / "missing.db"
    code, out, err = cli(capsys, "--db", str(missing), "rules", "check", str(ROOT / "rules" / "dev.to.yaml"))
    assert (code, err) == (0, "")
    assert "dev.to.yaml: 2 operations" in out
    code, out, _ = cli(capsys, "--db", str(missing), "rules", "explain", "POST", "https://dev.to/api/articles",
                       "--rules", str(ROOT / "rules" / "dev.to.yaml"))
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


# --- help ---------------------------------------------------------------------------------


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


def test_installed_script_help_of_every_command(tmp_path):
    assert RECEIPTS.exists(), f"{RECEIPTS} is not installed; run scripts/test to create the venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECEIPT_PROXY_")}
    env["HOME"] = str(tmp_path)
    runs = {name: subprocess.Popen([str(RECEIPTS), *([name] if name else []), "--help"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env)
            for name in ["", *COMMANDS]}
    missing = subprocess.Popen([str(RECEIPTS), "--db", str(tmp_path / "none.db"), "list"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=30)
        assert (proc.returncode, err) == (0, ""), name
        assert out.startswith(f"usage: receipts {name}".rstrip()), name
        assert "\nexamples:\n" in out, name
        if name:
            for example in COMMANDS[name].examples:
                assert f"\n  {example}\n" in out
                assert example.startswith(f"receipts {name}")
        else:
            for command in COMMANDS:
                assert f"\n  receipts {command} " in out
    out, err = missing.communicate(timeout=30)
    assert (missing.returncode, out) == (1, "")
    assert err == f"Error: no receipts database at {tmp_path / 'none.db'}\n"
    assert not (tmp_path / "none.db").exists()


def test_reconcile_before_the_settle_delay_says_when_to_try_again(recon, capsys):
    recon.add("slow", "other")
    rid = recon.receipt("x", kind="slow")  # outcome_unknown at the fake clock's T0
    read = f"read GET {recon.up.url}{recon.api_path('slow')} → HTTP 200: not found among 1 items"
    code, out, _ = recon.run(capsys, rid)
    assert code == 0
    assert out == (f"{rid}  outcome_unknown → outcome_unknown  {read}; this read proves absence only 600s after "
                   f"the outcome became unknown: try again after 2026-03-01T12:10:00.000000Z\n")
    assert recon.store.get(rid).state == "outcome_unknown" and recon.reads("slow") == 1
    recon.clock.advance(601)
    code, out, _ = recon.run(capsys, rid)
    assert out == f"{rid}  outcome_unknown → safe_to_retry  {read}; absence is proven and the rule allows a retry\n"
    assert recon.reads("slow") == 2 and recon.up.seen(recon.api_path("slow")) == 1  # reads only: the one seeded item
