"""`receipts report` (cli/enforcement_report.py): what enforcement did, or in observe mode would have done."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

from proxy_addon.states import State
from proxy_addon.store import Store
from tests.cli.conftest import assert_one_line_error, attempt, cli
from tests.conftest import T0, FakeClock


def observed_db(tmp_path):
    """At T0: a write whose outcome is unknown, a duplicate of it observe mode sent, one it blocked, a deny it sent."""
    path = tmp_path / "receipts.db"
    store = Store.open(path, clock=FakeClock(T0))
    try:
        first = store.begin_attempt(attempt(1)).receipt
        store.transition(first.operation_id, State.OUTCOME_UNKNOWN, reason="the connection dropped")
        shadow = store.begin_attempt(dataclasses.replace(attempt(1), observe=True)).receipt
        assert store.begin_attempt(attempt(1)).kind == "blocked"
        denied = dataclasses.replace(attempt(2), observe=True, denied="decisions[0] (line 7): deny when x == 1")
        sent = store.begin_attempt(denied).receipt
    finally:
        store.close()
    return path, first.operation_id, shadow.operation_id, sent.operation_id


def test_report_counts_what_was_done_and_what_would_have_been_done_with_examples(tmp_path, capsys):
    path, first, shadow, denied = observed_db(tmp_path)
    code, out, err = cli(
        capsys, "--db", str(path), "report", "--since", "1h", "--json", now=T0 + dt.timedelta(minutes=5)
    )
    assert (code, err) == (0, "")
    (row,) = json.loads(out)["operations"]
    assert (row["api"], row["operation"], row["writes"]) == ("dev.to", "articles.create", 3)
    assert (row["blocked"]["done"], row["blocked"]["would_have"]) == (1, 1)
    assert row["blocked"]["examples"][0]["operation_id"] == shadow  # blocked by the latest unresolved: the one sent
    (would,) = row["blocked"]["would_have_examples"]
    assert would["operation_id"] == shadow and f"duplicate of receipt {first}" in would["reason"]
    assert (row["denied"]["done"], row["denied"]["would_have"]) == (0, 1)
    assert row["denied"]["would_have_examples"][0]["operation_id"] == denied
    assert (row["replayed"]["done"], row["held"]["would_have"], row["refused"]["would_have"]) == (0, 0, 0)

    code, out, err = cli(capsys, "--db", str(path), "report", "--since", "1h", now=T0 + dt.timedelta(minutes=5))
    assert (code, err) == (0, "")
    assert "observe mode (receipts_mode=observe): 2 write(s) below were SENT" in out
    line = next(x for x in out.splitlines() if x.startswith("dev.to/articles.create"))
    assert line.split(None, 2)[:2] == ["dev.to/articles.create", "3"] and "1 + 1 would" in line
    assert shadow in out and first in out and denied in out


def test_report_since_excludes_what_came_before_and_says_when_there_is_nothing(tmp_path, capsys):
    path, *_ = observed_db(tmp_path)
    later = T0 + dt.timedelta(hours=2)
    code, out, err = cli(capsys, "--db", str(path), "report", "--since", "30m", now=later)
    assert (code, err) == (0, "")
    assert "no writes recorded, and nothing blocked, replayed, held, denied or refused" in out
    code, out, err = cli(capsys, "--db", str(path), "report", "--since", T0.isoformat(), "--json", now=later)
    assert json.loads(out)["operations"][0]["writes"] == 3
    assert_one_line_error(*cli(capsys, "--db", str(path), "report", "--since", "yesterday"), "--since", "yesterday")
