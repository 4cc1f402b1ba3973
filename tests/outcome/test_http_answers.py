"""
The answers the proxy makes itself (proxy_addon/outcome/http_answers.py): status, JSON body and headers,
for receipts made by a real store (begin_attempt + transition), without a proxy.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from proxy_addon.outcome import http_answers as answers
from proxy_addon.outcome.http_answers import Answer
from proxy_addon.states import State
from proxy_addon.store import Attempt, Receipt, RecordedResponse, Store
from tests.conftest import T0, FakeClock

RECEIPT_HEADERS = ("x-receipt-id", "x-receipt-state", "x-receipt-replayed")


def attempt(*, title: str = "hello", approval: bool = False) -> Attempt:
    return Attempt(
        api="test-api",
        operation="things.create",
        method="POST",
        target="http://127.0.0.1:9/api/things",
        intent_fingerprint=f"sha256:{title}",
        intent={"body": {"title": title}},
        principal="anonymous",
        approval=approval,
    )


# How to bring a new receipt to each state, through the store's legal transitions.
PATHS: dict[State, list[tuple[State, dict]]] = {
    State.SUBMITTED: [],
    State.AWAITING_APPROVAL: [],
    State.OUTCOME_UNKNOWN: [(State.OUTCOME_UNKNOWN, {"error": "outcome unknown: reset"})],
    State.RECONCILING: [(State.OUTCOME_UNKNOWN, {}), (State.RECONCILING, {})],
    State.MANUAL_REVIEW: [(State.OUTCOME_UNKNOWN, {}), (State.MANUAL_REVIEW, {})],
    State.SUCCEEDED: [(State.SUCCEEDED, {"http_status": 201, "external_id": "42"})],
    State.REJECTED: [(State.REJECTED, {"http_status": 400, "error": "HTTP 400"})],
}


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "r.db", clock=FakeClock())
    yield s
    s.close()


def receipt_in(store: Store, state: State, *, response: RecordedResponse | None = None) -> Receipt:
    approval = state is State.AWAITING_APPROVAL
    decision = store.begin_attempt(attempt(title=f"t-{state}", approval=approval))
    assert decision.kind == "forward"
    receipt = decision.receipt
    for to, fields in PATHS[state]:
        if to is State.SUCCEEDED and response is not None:
            fields = {**fields, "response": response}
        receipt = store.transition(receipt.operation_id, to, reason=f"to {to}", **fields)
    assert receipt.state is state
    return receipt


def header_map(answer: Answer) -> dict[str, str]:
    """The answer's headers by lower-case name; fails on a name given twice."""
    names = [k.lower() for k, _ in answer.headers]
    assert len(names) == len(set(names)), f"a header is given twice: {names}"
    return {k.lower(): v for k, v in answer.headers}


def json_of(answer: Answer) -> dict:
    headers = header_map(answer)
    assert headers["content-type"] == "application/json"
    assert headers["cache-control"] == "no-store"
    assert headers["content-length"] == str(len(answer.body))
    return json.loads(answer.body)


# --- duplicate -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "hint"),
    [
        (State.SUBMITTED, "still in flight"),
        (State.AWAITING_APPROVAL, "waiting for an operator's approval"),
        (State.OUTCOME_UNKNOWN, "reconcile it before retrying"),
        (State.RECONCILING, "being reconciled"),
        (State.MANUAL_REVIEW, "needs manual review"),
    ],
)
def test_blocked_duplicate_says_why_per_state(store, state, hint):
    r = receipt_in(store, state)
    a = answers.duplicate(r, "blocked")
    doc = json_of(a)
    assert a.status == 409
    assert doc == {
        "error": "duplicate_unresolved",
        "operation_id": r.operation_id,
        "api": "test-api",
        "operation": "things.create",
        "state": str(state),
        "submitted_at": r.submitted_at,
        "hint": doc["hint"],
    }
    assert hint in doc["hint"]
    headers = header_map(a)
    assert (headers["x-receipt-id"], headers["x-receipt-state"]) == (r.operation_id, str(state))
    assert "retry-after" not in headers
    assert "retry_after" not in doc


def test_blocked_succeeded_duplicate_names_the_created_object(store):
    r = receipt_in(store, State.SUCCEEDED)
    a = answers.duplicate(r, "blocked_succeeded")
    doc = json_of(a)
    assert a.status == 409
    assert doc["error"] == "duplicate_succeeded"
    assert (doc["operation_id"], doc["state"], doc["external_id"]) == (r.operation_id, "succeeded", "42")
    assert doc["completed_at"] == r.completed_at is not None
    assert "already succeeded" in doc["hint"]
    assert header_map(a)["x-receipt-state"] == "succeeded"


def test_key_conflict_is_a_422(store):
    r = receipt_in(store, State.SUBMITTED)
    a = answers.duplicate(r, "key_conflict")
    doc = json_of(a)
    assert a.status == 422
    assert doc["error"] == "idempotency_key_reused"
    assert (doc["operation_id"], doc["api"], doc["operation"]) == (r.operation_id, "test-api", "things.create")
    assert "state" not in doc
    assert header_map(a)["x-receipt-id"] == r.operation_id


@pytest.mark.parametrize(
    ("ahead", "header"),
    [
        (2.5, "3"),  # rounded up
        (120, "120"),
        (0.2, "1"),  # never below one second
        (-30, "1"),  # already past: still 1, never 0 or negative
    ],
)
def test_retry_after_header_and_body(store, ahead, header):
    r = receipt_in(store, State.OUTCOME_UNKNOWN)
    when = T0 + dt.timedelta(seconds=ahead)
    a = answers.duplicate(r, "blocked", retry_after=when, now=T0)
    doc = json_of(a)
    assert a.status == 409
    assert header_map(a)["retry-after"] == header
    assert int(header) >= 1
    assert doc["retry_after"] == when.isoformat().replace("+00:00", "Z")
    assert doc["retry_after"].endswith("Z")
    assert dt.datetime.fromisoformat(doc["retry_after"]) == when
    assert doc["retry_after"] in doc["hint"]


# --- replay ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "recorded_headers",
    [
        pytest.param([("Content-Type", "application/json"), ("X-Custom", "a"), ("X-Custom", "b")], id="plain"),
        pytest.param(
            [
                ("Content-Type", "application/json"),
                ("CONTENT-LENGTH", "999"),
                ("X-Receipt-Id", "other"),
                ("x-receipt-state", "submitted"),
                ("X-Custom", "a"),
                ("X-Custom", "b"),
            ],
            id="stale-length-and-receipt-headers",
        ),
        # the answer of a next-hop receipt-proxy that replayed it (an upstream: proxy chain)
        pytest.param(
            [
                ("Content-Type", "application/json"),
                ("X-Custom", "a"),
                ("X-Custom", "b"),
                ("X-Receipt-Replayed", "true"),
                ("X-Receipt-Id", "other"),
            ],
            id="next-hop-replay",
        ),
    ],
)
def test_replay_gives_the_recorded_answer_marked_as_a_replay(store, recorded_headers):
    body = b'{"id": 7, "title": "hello"}'
    r = receipt_in(store, State.SUCCEEDED, response=RecordedResponse(201, recorded_headers, body))
    again = store.begin_attempt(attempt(title=f"t-{State.SUCCEEDED}"))  # a duplicate: the answer opened to replay
    assert again.kind == "replay" and again.answer is not None
    assert again.answer.headers == recorded_headers  # through the store, sealed, and back
    a = answers.replay(r, again.answer)
    assert a.status == 201
    assert a.body == body
    names = [k.lower() for k, _ in a.headers]
    for name in ("content-length", *RECEIPT_HEADERS):
        assert names.count(name) == 1, f"{name} appears {names.count(name)} times in {a.headers}"
    headers = {k.lower(): v for k, v in a.headers}
    assert headers["content-length"] == str(len(body))
    assert headers["x-receipt-replayed"] == "true"
    assert (headers["x-receipt-id"], headers["x-receipt-state"]) == (r.operation_id, "succeeded")
    assert headers["content-type"] == "application/json"
    assert [v for k, v in a.headers if k == "X-Custom"] == ["a", "b"]  # recorded headers kept, in order


# --- unavailable, exchange_failed, denied ----------------------------------------------------


def test_unavailable_says_nothing_was_sent():
    a = answers.unavailable("test-api", "things.create", "database is locked")
    doc = json_of(a)
    assert a.status == 503
    assert doc["error"] == "receipt_store_unavailable"
    assert doc["sent"] is False
    assert (doc["api"], doc["operation"], doc["detail"]) == ("test-api", "things.create", "database is locked")
    headers = header_map(a)
    assert int(headers["retry-after"]) >= 1
    assert "x-receipt-id" not in headers


@pytest.mark.parametrize(
    ("state", "timed_out", "status", "error", "hint"),
    [
        (State.OUTCOME_UNKNOWN, False, 502, "outcome_unknown", "may have taken effect"),
        (State.OUTCOME_UNKNOWN, True, 504, "outcome_unknown", "may have taken effect"),
        (State.NOT_SENT, False, 502, "not_sent", "safe to send again"),
        (State.NOT_SENT, True, 504, "not_sent", "safe to send again"),
    ],
)
def test_exchange_failed(state, timed_out, status, error, hint):
    operation_id = "20260301T120000Z-abc"
    a = answers.exchange_failed(operation_id, state, "ReadError: reset", timed_out=timed_out)
    doc = json_of(a)
    assert a.status == status
    assert doc["error"] == error
    assert (doc["operation_id"], doc["state"], doc["detail"]) == (operation_id, str(state), "ReadError: reset")
    assert hint in doc["hint"]
    headers = header_map(a)
    assert (headers["x-receipt-id"], headers["x-receipt-state"]) == (operation_id, str(state))


@pytest.mark.parametrize("state", [State.AWAITING_APPROVAL, State.REJECTED])
def test_denied(store, state):
    r = receipt_in(store, State.AWAITING_APPROVAL)
    if state is State.REJECTED:
        r = store.transition(r.operation_id, State.REJECTED, reason="denied by alice")
    a = answers.denied(r, "denied by alice")
    doc = json_of(a)
    assert a.status == 403
    assert doc["error"] == "denied_by_operator"
    assert doc["sent"] is False
    assert (doc["operation_id"], doc["state"], doc["reason"]) == (r.operation_id, str(state), "denied by alice")
    assert (doc["api"], doc["operation"]) == ("test-api", "things.create")
    assert header_map(a)["x-receipt-state"] == str(state)


# --- recorded --------------------------------------------------------------------------------

UPSTREAM_HEADERS = [
    ("Content-Type", "application/json"),
    ("Location", "/api/things/7"),
    ("X-Request-Id", "r-1"),
    ("Set-Cookie", "s=1"),
    ("set-cookie", "t=2"),
    ("Set-Cookie2", "u=3"),
    ("Authorization", "Bearer x"),
    ("WWW-Authenticate", "Bearer"),
    ("Proxy-Authenticate", "Basic"),
    ("Connection", "keep-alive"),
    ("Keep-Alive", "timeout=5"),
    ("Transfer-Encoding", "chunked"),
    ("Content-Length", "10"),
    ("Content-Encoding", "gzip"),
    ("Upgrade", "h2c"),
    ("Proxy-Connection", "close"),
    ("Trailer", "X-T"),
    ("TE", "trailers"),
    ("Alt-Svc", 'h3=":443"'),
]


def test_recorded_drops_credentials_and_framing():
    rec = answers.recorded(201, UPSTREAM_HEADERS, b'{"id": 7}', 1024)
    assert rec.status == 201
    assert rec.headers == [("Content-Type", "application/json"), ("Location", "/api/things/7"), ("X-Request-Id", "r-1")]
    assert (rec.body, rec.truncated) == (b'{"id": 7}', False)


@pytest.mark.parametrize(
    ("body", "cap", "kept", "truncated"),
    [
        (b"0123456789", 1024, b"0123456789", False),
        (b"0123456789", 10, b"0123456789", False),  # exactly the cap: whole
        (b"0123456789", 9, b"012345678", True),
        (b"0123456789", 0, b"", True),
        (b"", 0, b"", False),
    ],
)
def test_recorded_caps_the_body(body, cap, kept, truncated):
    rec = answers.recorded(200, [("Content-Type", "text/plain")], body, cap)
    assert (rec.body, rec.truncated) == (kept, truncated)


def test_a_truncated_recording_is_never_replayed(store):
    """What `recorded` keeps goes through the store: a truncated body is blocked, not replayed as if whole."""
    rec = answers.recorded(201, UPSTREAM_HEADERS, b'{"id": 7, "long": "....."}', 8)
    r = receipt_in(store, State.SUCCEEDED, response=rec)
    assert store.answer_seal is not None and r.response is not None
    assert store.answer_seal.open(r.operation_id, r.response) == rec
    assert r.response.truncated
    again = store.begin_attempt(attempt(title=f"t-{State.SUCCEEDED}"))
    assert again.kind == "blocked_succeeded"
    doc = json_of(answers.duplicate(again.receipt, again.kind))
    assert (doc["error"], doc["operation_id"]) == ("duplicate_succeeded", r.operation_id)
