"""`receipts show`."""

from __future__ import annotations

import dataclasses
import json

import pytest

from proxy_addon.states import State
from proxy_addon.store import Store
from tests.cli.conftest import BODY_MARKER, UNKNOWN_ID, assert_one_line_error, at, attempt, cli
from tests.conftest import FakeClock


def show_sections(out: str) -> tuple[dict[str, str], list[str], list[str]]:
    head, rest = out.split("events:\n", 1)
    fields = dict(line.split(None, 1) for line in head.splitlines())
    events, _, dups = rest.partition("duplicates")
    events = events.split("decisions")[0]
    return fields, events.splitlines(), dups.splitlines()


def test_show_prints_the_decisions_applied(tmp_path, capsys):
    """A rule's deny, an operator's resolution by hand: each in `decisions`, read from the events."""
    db = tmp_path / "receipts.db"
    store = Store.open(db, clock=FakeClock())
    try:
        denied = store.begin_attempt(dataclasses.replace(attempt(1), denied="amount over 100")).receipt
        unknown = store.begin_attempt(attempt(2)).receipt
        store.transition(unknown.operation_id, State.OUTCOME_UNKNOWN, reason="upstream reset")
        store.resolve(unknown.operation_id, State.SUCCEEDED, note="it is on the dashboard", actor="cli:alice")
    finally:
        store.close()
    code, out, _ = cli(capsys, "--db", str(db), "show", unknown.operation_id)
    assert code == 0
    decisions = out.split("decisions:\n", 1)[1].split("duplicates")[0].splitlines()
    assert [d.split(None, 1)[1] for d in decisions] == [
        "taken into review                    cli:alice  taken into review: it is on the dashboard",
        "resolved by hand as succeeded        cli:alice  resolved by hand: it is on the dashboard",
    ]
    code, out, _ = cli(capsys, "--db", str(db), "show", denied.operation_id, "--json")
    [decision] = json.loads(out)["decisions"]
    assert decision["decision"] == "denied by a rule's decision, never sent" and decision["by"] == "proxy"
    assert "amount over 100" in decision["why"]


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
    assert dups[1].split(None, 4) == [
        at(hours=23),
        "blocked",
        "proxy",
        "flow-22",
        "duplicate blocked: the first attempt is unresolved",
    ]
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
    assert [
        {k: e[k] for k in ("event", "from_state", "to_state", "reason", "actor", "at")} for e in data["events"]
    ] == [
        {
            "event": "transition",
            "from_state": None,
            "to_state": "submitted",
            "reason": "new attempt",
            "actor": "proxy",
            "at": at(),
        },
        {
            "event": "transition",
            "from_state": "submitted",
            "to_state": "succeeded",
            "reason": "HTTP 201",
            "actor": "proxy",
            "at": at(),
        },
    ]
    assert all(e["operation_id"] == ids["succeeded"] for e in data["events"])
    assert data["events"][0]["flow_id"] == "flow-1"
    [dup] = data["duplicates"]
    assert {k: v for k, v in dup.items() if k != "id"} == {
        "operation_id": ids["succeeded"],
        "at": at(hours=1),
        "event": "replayed",
        "from_state": "succeeded",
        "to_state": "succeeded",
        "reason": "duplicate answered with the recorded response",
        "actor": "proxy",
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
        ("blocked", at(hours=23), "flow-22"),
        ("blocked", at(hours=24), "flow-dup"),
    ]


@pytest.mark.parametrize("extra", [pytest.param([], id="text"), pytest.param(["--json"], id="json")])
def test_show_unknown_id(db, capsys, extra):
    path, _ = db
    code, out, err = cli(capsys, "--db", str(path), "show", UNKNOWN_ID, *extra)
    assert_one_line_error(code, out, err, UNKNOWN_ID)
