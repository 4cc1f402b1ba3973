"""`receipts export`."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tests.cli.conftest import BODY_MARKER, SINCE_CASES, at, cli
from tests.conftest import T0


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
    assert (ok["state"], ok["http_status"], ok["response_status"], ok["external_id"]) == (
        "succeeded",
        201,
        201,
        "art_1",
    )
    assert ok["intent"] == {"body": {"article.title": "Post 1"}} and ok["submitted_at"] == at()
    assert [(e["event"], e["from_state"], e["to_state"], e["at"]) for e in ok["events"]] == [
        ("transition", None, "submitted", at()),
        ("transition", "submitted", "succeeded", at()),
        ("replayed", "succeeded", "succeeded", at(hours=1)),
    ]
    assert [(e["event"], e["to_state"], e["flow_id"]) for e in unk["events"]] == [
        ("transition", "submitted", "flow-22"),
        ("transition", "outcome_unknown", None),
        ("blocked", "outcome_unknown", "flow-22"),
        ("blocked", "outcome_unknown", "flow-dup"),
    ]
    assert (unk["error"], unk["response_status"]) == ("server closed connection", None)
    assert (sub["state"], len(sub["events"]), sub["events"][0]["reason"]) == ("submitted", 1, "new attempt")
    # the same fields as `show --json`, events and duplicates together
    code, shown, _ = cli(capsys, "--db", str(path), "show", ids["outcome_unknown"], "--json")
    shown = json.loads(shown)
    assert {k: v for k, v in unk.items() if k != "events"} == {
        k: v for k, v in shown.items() if k not in ("events", "duplicates")
    }
    assert unk["events"] == shown["events"] + shown["duplicates"]


@pytest.mark.parametrize("since, expected", SINCE_CASES)
def test_export_since(timeline, capsys, since, expected):
    path, ids = timeline
    code, out, _ = cli(capsys, "--db", str(path), "export", "--since", since, now=T0 + dt.timedelta(hours=4))
    assert code == 0
    assert [json.loads(line)["operation_id"] for line in out.splitlines()] == [ids[k] for k in reversed(expected)]
