"""`receipts resolve`."""

from __future__ import annotations

import getpass
import json

import pytest

from proxy_addon.cli import main
from tests.cli.conftest import UNKNOWN_ID, assert_one_line_error, at, attempt, cli, dump


@pytest.mark.parametrize("resolution", ["succeeded", "safe_to_retry", "rejected"])
@pytest.mark.parametrize("start", ["outcome_unknown", "manual_review"])
def test_resolve(review, capsys, alice, start, resolution):
    path, ids, clock, store = review
    rid = ids[start]
    events_before = store.events(rid)
    code, out, err = cli(
        capsys,
        "--db",
        str(path),
        "resolve",
        rid,
        "--as",
        resolution,
        "--note",
        "  checked the dashboard  ",
        now=clock.now,
    )
    assert (code, err) == (0, "")
    assert out == f"{rid} is now {resolution} (was {start})\n"
    r = store.get(rid)
    assert r.state == resolution and r.external_id is None
    new = store.events(rid)[len(events_before) :]
    expected = [("manual_review", resolution, "resolved by hand: checked the dashboard")]
    if start == "outcome_unknown":
        expected.insert(0, ("outcome_unknown", "manual_review", "taken into review: checked the dashboard"))
    assert [(e.from_state, e.to_state, e.reason) for e in new] == expected
    assert {(e.actor, e.at) for e in new} == {("cli:alice", at(minutes=10))}


def test_resolve_succeeded_with_an_external_id_shows_in_show_json(review, capsys, alice):
    path, ids, clock, _ = review
    rid = ids["manual_review"]
    code, out, _ = cli(
        capsys,
        "--db",
        str(path),
        "resolve",
        rid,
        "--as",
        "succeeded",
        "--note",
        "live at /p/42",
        "--external-id",
        "42",
        now=clock.now,
    )
    assert (code, out) == (0, f"{rid} is now succeeded (was manual_review)\n")
    code, out, _ = cli(capsys, "--db", str(path), "show", rid, "--json", now=clock.now)
    data = json.loads(out)
    assert (data["state"], data["external_id"], data["updated_at"]) == ("succeeded", "42", at(minutes=10))
    assert data["events"][-1] == {
        **data["events"][-1],
        "from_state": "manual_review",
        "to_state": "succeeded",
        "actor": "cli:alice",
        "reason": "resolved by hand: live at /p/42",
    }


def test_resolve_safe_to_retry_lets_the_next_identical_request_through(review, capsys, alice):
    path, ids, _, store = review
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
    code, _, _ = cli(
        capsys, "--db", str(path), "resolve", ids["manual_review"], "--as", "rejected", "--note", "refused"
    )
    assert code == 0
    assert store.events(ids["manual_review"])[-1].actor == "cli"


@pytest.mark.parametrize(
    "target, argv, needles",
    [
        pytest.param("unknown", ["--as", "succeeded", "--note", "x"], [UNKNOWN_ID], id="unknown-id"),
        pytest.param(
            "succeeded",
            ["--as", "safe_to_retry", "--note", "x"],
            ["is succeeded", "outcome_unknown"],
            id="already-succeeded",
        ),
        pytest.param("rejected", ["--as", "succeeded", "--note", "x"], ["is rejected"], id="already-rejected"),
        pytest.param("submitted", ["--as", "succeeded", "--note", "x"], ["is submitted"], id="still-submitted"),
        pytest.param("reconciling", ["--as", "succeeded", "--note", "x"], ["is reconciling"], id="reconciling"),
        pytest.param("manual_review", ["--as", "succeeded", "--note", ""], ["--note"], id="empty-note"),
        pytest.param("outcome_unknown", ["--as", "succeeded", "--note", " \t "], ["--note"], id="blank-note"),
        pytest.param(
            "outcome_unknown",
            ["--as", "rejected", "--note", "x", "--external-id", "9"],
            ["--external-id", "--as succeeded"],
            id="external-id-without-succeeded",
        ),
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
