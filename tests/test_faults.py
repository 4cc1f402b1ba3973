"""
The fault matrix: every upstream fault against every client, through a real proxy.

Each cell asserts what the upstream committed (it counts), the receipt's state and
events, what the client received, and what an identical second attempt gets.
`docs/guarantees.md` is generated from FAULTS (`.venv/bin/python -m tests.test_faults >
docs/guarantees.md`), and `test_guarantees_doc_matches_the_matrix` keeps them equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import CLIENTS, Clients, wait_for
from tests.upstream import Upstream, free_port

DOC = Path(__file__).resolve().parent.parent / "docs" / "guarantees.md"


@dataclass(frozen=True)
class Fault:
    id: str
    what: str  # for the doc
    upstream: str | None  # the test upstream's fault; None: no upstream listens (refused) or TLS fails
    client_gets: int | None  # the status the agent receives; None: its own timeout fires first
    answer: str | None  # the proxy's JSON "error", when the proxy answers instead of the upstream
    state: str  # the receipt's final state
    commits: int  # writes the upstream committed after the first attempt
    retry: str  # what an identical second attempt gets: replayed, blocked or forwarded
    retry_status: int | None


FAULTS = [
    Fault("ok", "the upstream commits and answers 201", "ok", 201, None, "succeeded", 1, "replayed", 201),
    Fault("commit-then-drop", "commits, then closes the connection without answering", "drop", 502,
          "outcome_unknown", "outcome_unknown", 1, "blocked", 409),
    Fault("commit-then-hang", "commits, then holds the connection past the client's timeout (1 s) and closes at 2.5 s",
          "hang", None, None, "outcome_unknown", 1, "blocked", 409),
    Fault("drop-before-commit", "closes the connection without committing or answering", "lost", 502,
          "outcome_unknown", "outcome_unknown", 0, "blocked", 409),
    Fault("400", "refuses with 400", "400", 400, None, "rejected", 0, "forwarded", 201),
    Fault("429", "refuses with 429 and Retry-After", "429", 429, None, "rejected", 0, "forwarded", 201),
    Fault("500-after-commit", "commits, then answers 500", "500", 500, None, "outcome_unknown", 1, "blocked", 409),
    Fault("half-response", "commits, sends half a response, closes", "half", 502, "outcome_unknown",
          "outcome_unknown", 1, "blocked", 409),
    Fault("connection-refused", "nothing listens on the port", None, 502, "not_sent", "not_sent", 0, "forwarded", 502),
    Fault("tls-handshake-failure", "the upstream's certificate is not trusted", None, 502, "not_sent", "not_sent", 0,
          "forwarded", 502),
]

RETRY_MEANS = {
    "replayed": "the recorded answer, with `X-Receipt-Replayed: true`; not sent again",
    "blocked": "409 `duplicate_unresolved`; not sent again",
    "forwarded": "sent as a new attempt with `retry_of` set",
}


def render() -> str:
    lines = [
        "# What receipt-proxy guarantees, fault by fault",
        "",
        "Generated from the fault matrix in `tests/test_faults.py` with",
        "`.venv/bin/python -m tests.test_faults > docs/guarantees.md`; `scripts/test` runs every",
        "cell against `requests`, `httpx` and `curl` through a real mitmdump and a real upstream,",
        "and checks that this page still matches the matrix.",
        "",
        "| fault | the upstream | the agent gets | receipt | upstream commits | an identical retry gets |",
        "|---|---|---|---|---|---|",
    ]
    for f in FAULTS:
        got = "its own timeout" if f.client_gets is None else str(f.client_gets)
        if f.answer:
            got += f" `{f.answer}`"
        lines.append(f"| {f.id} | {f.what} | {got} | `{f.state}` | {f.commits} | {f.retry}: {RETRY_MEANS[f.retry]} |")
    lines += [
        "",
        "With a `reconcile` spec in the rule, a retry of an `outcome_unknown` receipt first",
        "triggers a read (see README): found → the `after_success` answer; proven absent →",
        "forwarded; otherwise `manual_review` and 409. A retry that arrives while the first",
        "attempt is still in flight waits for its outcome (`receipts_wait_submitted`).",
        "",
    ]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def fault_upstream():
    with Upstream(hang_seconds=2.5) as up:
        yield up


@pytest.fixture(scope="module")
def untrusted_upstream(tmp_path_factory):
    """A TLS upstream whose certificate the proxy was not told to trust."""
    with Upstream(tls=True, certdir=tmp_path_factory.mktemp("untrusted-cert")) as up:
        yield up


def events(store, operation_id: str) -> list[tuple[str, str | None, str]]:
    return [(e.event, e.from_state, e.to_state) for e in store.events(operation_id)]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("fault", FAULTS, ids=[f.id for f in FAULTS])
def test_fault_matrix(fault: Fault, client: str, proxy, clients: Clients, fault_upstream, untrusted_upstream, bucket):
    from proxy_addon.store import Store

    if fault.id == "connection-refused":
        base, up = f"http://127.0.0.1:{free_port()}", None
    elif fault.id == "tls-handshake-failure":
        base, up = untrusted_upstream.url, untrusted_upstream
    else:
        base, up = fault_upstream.url, fault_upstream
    path = f"/api/{bucket}/plain"
    if fault.upstream:
        up.plan(path, fault.upstream)
    timeout = 1.0 if fault.id == "commit-then-hang" else 10.0

    first = clients.send(client, "POST", base + path, {"title": fault.id}, timeout=timeout)
    assert first.status == fault.client_gets, first
    if fault.answer:
        assert first.json()["error"] == fault.answer
    if first.status is not None:
        assert first.headers["x-receipt-id"]

    def settled():
        store = Store.open(proxy.db, create=False)
        try:
            rs = [r for r in store.list(limit=None) if bucket in r.target]
            return rs if rs and all(r.state != "submitted" for r in rs) else None
        finally:
            store.close()

    (receipt,) = wait_for(settled, timeout=15, what="the receipt's outcome")
    assert receipt.state == fault.state
    if up is not None:
        assert up.commits(path) == fault.commits

    retry = clients.send(client, "POST", base + path, {"title": fault.id}, timeout=10.0)
    assert retry.status == fault.retry_status, retry
    store = Store.open(proxy.db, create=False)
    try:
        receipts = sorted((r for r in store.list(limit=None) if bucket in r.target), key=lambda r: r.submitted_at)
        first_events = events(store, receipt.operation_id)
        assert first_events[:2] == [("transition", None, "submitted"), ("transition", "submitted", fault.state)]
        if fault.retry == "forwarded":
            assert len(receipts) == 2
            assert receipts[1].retry_of == receipt.operation_id
            assert first_events[2:] == []
            if up is not None and fault.upstream:
                assert up.commits(path) == fault.commits + 1  # the retry went out, once
        else:
            assert len(receipts) == 1
            assert first_events[2:] == [("replayed" if fault.retry == "replayed" else "blocked", fault.state, fault.state)]
            assert retry.headers["x-receipt-id"] == receipt.operation_id
            if fault.retry == "replayed":
                assert retry.headers["x-receipt-replayed"] == "true"
                assert retry.body == first.body
            else:
                assert (retry.json()["error"], retry.json()["state"]) == ("duplicate_unresolved", fault.state)
            if up is not None:
                assert up.commits(path) == fault.commits  # never sent again
    finally:
        store.close()


def test_guarantees_doc_matches_the_matrix():
    assert DOC.read_text() == render(), "regenerate: .venv/bin/python -m tests.test_faults > docs/guarantees.md"


if __name__ == "__main__":
    print(render(), end="")
