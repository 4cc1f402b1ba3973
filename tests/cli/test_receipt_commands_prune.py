"""`receipts prune`."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from proxy_addon.cli import main
from proxy_addon.states import State
from proxy_addon.store import Store
from tests.cli.conftest import assert_one_line_error, attempt, cli, dump
from tests.conftest import T0, FakeClock


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
    ids["old_parent_of_unresolved"] = new(9, State.NOT_SENT)  # its retry below is unresolved
    ids["old_parent_of_resolved"] = new(10, State.NOT_SENT)  # its retry below is resolved too
    ids["old_resolved_retry"] = new(10, State.SUCCEEDED)
    clock.advance(86400)
    ids["unresolved_retry"] = new(9, State.OUTCOME_UNKNOWN)  # T0+1d, retry_of old_parent_of_unresolved
    clock.now = T0 + dt.timedelta(days=35)
    ids["recent_succeeded"] = new(11, State.SUCCEEDED)
    assert store.get(ids["unresolved_retry"]).retry_of == ids["old_parent_of_unresolved"]
    assert store.get(ids["old_resolved_retry"]).retry_of == ids["old_parent_of_resolved"]
    clock.now = T0 + dt.timedelta(days=40)
    yield path, ids, clock, store
    store.close()


PRUNED = {
    "old_succeeded",
    "old_rejected",
    "old_safe_to_retry",
    "old_not_sent",
    "old_parent_of_resolved",
    "old_resolved_retry",
}


def test_prune_deletes_old_resolved_receipts_only(aged, capsys):
    path, ids, clock, _ = aged
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
        ids["old_submitted"]: "submitted",
        ids["old_outcome_unknown"]: "outcome_unknown",
        ids["old_manual_review"]: "manual_review",
        ids["old_reconciling"]: "reconciling",
        ids["old_parent_of_unresolved"]: "not_sent",
        ids["unresolved_retry"]: "outcome_unknown",
        ids["recent_succeeded"]: "succeeded",
    }
    code, out, err = cli(capsys, "--db", str(path), "show", ids["old_succeeded"], now=clock.now)
    assert_one_line_error(code, out, err, ids["old_succeeded"])
    code, out, _ = cli(capsys, "--db", str(path), "prune", "--older-than", "30d", now=clock.now)
    assert (code, out) == (0, "deleted 0 resolved receipts last changed more than 30d ago\n")


def test_prune_dry_run_deletes_nothing(aged, capsys):
    path, _, clock, _ = aged
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
        ids["old_submitted"]: "submitted",
        ids["old_outcome_unknown"]: "outcome_unknown",
        ids["old_manual_review"]: "manual_review",
        ids["old_reconciling"]: "reconciling",
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
