"""`receipts blocked`."""

from __future__ import annotations

import json

import pytest

from proxy_addon.store import Store
from tests.cli.conftest import BLOCKED_HEADERS, at, attempt, cli, table


def test_blocked_lists_duplicates_newest_first(db, capsys):
    path, ids = db
    code, out, err = cli(capsys, "--db", str(path), "blocked")
    assert (code, err) == (0, "")
    assert table(out, BLOCKED_HEADERS) == [
        {
            "TIME": "2026-03-02T12:00:00Z",
            "KIND": "blocked",
            "RECEIPT": ids["outcome_unknown"],
            "OPERATION": "dev.to/articles.create",
            "STATE": "outcome_unknown",
            "REASON": "duplicate blocked: the first attempt is unresolved",
        },
        {
            "TIME": "2026-03-02T11:00:00Z",
            "KIND": "blocked",
            "RECEIPT": ids["outcome_unknown"],
            "OPERATION": "dev.to/articles.create",
            "STATE": "outcome_unknown",
            "REASON": "duplicate blocked: the first attempt is unresolved",
        },
        {
            "TIME": "2026-03-01T13:00:00Z",
            "KIND": "replayed",
            "RECEIPT": ids["succeeded"],
            "OPERATION": "dev.to/articles.create",
            "STATE": "succeeded",
            "REASON": "duplicate answered with the recorded response",
        },
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
        "at": at(hours=24),
        "event": "blocked",
        "operation_id": ids["outcome_unknown"],
        "api": "dev.to",
        "operation": "articles.create",
        "receipt_state": "outcome_unknown",
        "reason": "duplicate blocked: the first attempt is unresolved",
        "actor": "proxy",
        "flow_id": "flow-dup",
    }
    assert (data[2]["receipt_state"], data[2]["reason"]) == (
        "succeeded",
        "duplicate answered with the recorded response",
    )


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
