"""
Rules drafted from traffic, end to end (issue 30: "A flows test records a session of writes through
the proxy (some with retries) to a test API and drafts rules from it. The draft's templates and
fingerprint fields make the next run's retries duplicates and distinct writes new."):

1. a real mitmdump with the receipts addon, whose rules name another host (every write passes
   unmatched), records a session with `-w session.flows` and `--set receipts_learn=learn.jsonl`: notes
   written to a collection, two of them retried after the upstream's faults (a 500, a dropped
   connection) with a new request id and timestamp in the retry's body, as SDKs send; cards written to
   two boards;
2. `receipts rules draft --flows` drafts rules from each file: both load, both give the same
   templates and fingerprint fields, and neither holds a marker secret nor (from the learn file) a value;
3. a new proxy enforcing the draft: a note's retry after a 500 is a duplicate (409, the upstream's
   count unchanged), a new note and a card on a new board are new writes; its receipts_learn file
   has a line for each of these matched writes too.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from proxy_addon.draft.request_shapes import read_shape_lines
from proxy_addon.rules import load_rules
from tests.conftest import ROOT, SECRETS
from tests.e2e.processes import Clients, Proxy

pytestmark = pytest.mark.e2e

OTHER_RULES = """
api: elsewhere
hosts: [api.elsewhere.invalid]
operations:
  things.create:
    match: {method: POST, path: /things}
"""


def note(title: str) -> dict:
    """A note as an SDK sends it: a new request id and timestamp with each attempt."""
    return {"title": title, "text": f"the text of {title}", "request_id": uuid.uuid4().hex, "sent_at": time.time()}


def draft(path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "proxy_addon.cli", "rules", "draft", "--flows", str(path), "--host", "127.0.0.1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def operations(text: str) -> dict[tuple[str, str], tuple[str, ...] | None]:
    rules = load_rules(text, source="draft")
    return {(op.method, op.path.template): op.fingerprint.body for op in rules.operations}


def test_rules_drafted_from_a_recorded_session_make_retries_duplicates(tmp_path, confdir, upstream, bucket):
    notes, cards = f"/api/{bucket}/notes", f"/api/{bucket}/boards/{{}}/cards"
    base = upstream.url
    other = tmp_path / "other.yaml"
    other.write_text(OTHER_RULES)
    flows, learn = tmp_path / "session.flows", tmp_path / "learn.jsonl"
    (tmp_path / "rec").mkdir()
    recorder = Proxy(
        tmp_path / "rec", confdir, rules=other, extra=("-w", str(flows), "--set", f"receipts_learn={learn}")
    )
    try:
        recorder.start()
        c = Clients(recorder)
        assert c.send("requests", "POST", base + notes, note("first")).status == 201
        upstream.plan(notes, "500")
        assert c.send("requests", "POST", base + notes, note("second")).status == 500
        assert c.send("requests", "POST", base + notes, note("second")).status == 201  # its retry
        upstream.plan(notes, "drop")
        assert c.send("requests", "POST", base + notes, note("third")).status == 502  # no answer
        assert c.send("requests", "POST", base + notes, note("third")).status == 201  # its retry
        assert c.send("requests", "POST", base + notes, note("fourth")).status == 201
        for board, title in ((11, "todo"), (12, "done")):
            assert c.send("requests", "POST", base + cards.format(board), note(title)).status == 201
    finally:
        recorder.stop()
    assert upstream.commits(notes) == 6  # unmatched: every attempt went out

    from_flows, from_learn = draft(flows), draft(learn)
    learned = learn.read_text()
    assert len(learned.splitlines()) == 8
    for text in (learned, from_flows, from_learn):
        for secret in SECRETS.values():
            assert secret not in text
    assert "the text of" not in learned and "the text of" not in from_learn  # names and keyed hashes only
    ops = operations(from_flows)
    assert ops == operations(from_learn)
    note_op = next(fp for (m, path), fp in ops.items() if m == "POST" and path.endswith("/notes"))
    card_path = next(path for (m, path) in ops if path.endswith("/cards"))
    assert note_op == ("title", "text")  # request_id and sent_at changed in the retries
    assert card_path.split("/")[-2].startswith("{")  # the board's id is a parameter
    assert "changed between an attempt and its retry" in from_flows and "request_id, sent_at" in from_flows
    assert "4 distinct writes and 2 retries" in from_flows

    rules = tmp_path / "drafted.yaml"
    rules.write_text(from_flows)
    (tmp_path / "run").mkdir()
    relearn = tmp_path / "relearn.jsonl"
    enforcing = Proxy(tmp_path / "run", confdir, rules=rules, extra=("--set", f"receipts_learn={relearn}"))
    try:
        enforcing.start()
        c = Clients(enforcing)
        upstream.plan(notes, "500")
        first = c.send("requests", "POST", base + notes, note("fifth"))
        assert first.status == 500 and "x-receipt-id" in first.headers  # matched: a receipt, outcome unknown
        assert upstream.commits(notes) == 7
        retry = c.send("requests", "POST", base + notes, note("fifth"))  # new request id and timestamp
        assert retry.status == 409, retry.body
        assert upstream.commits(notes) == 7  # the retry never left
        fresh = c.send("requests", "POST", base + notes, note("sixth"))
        assert fresh.status == 201 and upstream.commits(notes) == 8  # a distinct write is new
        card = c.send("requests", "POST", base + cards.format(13), note("todo"))
        assert card.status == 201 and "x-receipt-id" in card.headers and upstream.commits(cards.format(13)) == 1
    finally:
        enforcing.stop()
    # Matched writes are learned too; the duplicate the proxy answered itself has no upstream status.
    shapes = list(read_shape_lines(relearn.read_text().splitlines(), str(relearn)))
    assert [s.status for s in shapes] == [500, None, 201, 201]
