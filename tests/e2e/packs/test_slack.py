"""
rules/slack.yaml against a fake Slack: chat.postMessage answers HTTP 200 with
{"ok": true/false, ...}; internal_error and fatal_error leave the outcome unknown; the
reconcile read is conversations.history since the attempt, which can prove success but
never absence.

Every test uses its own channel id and text, so counts and fingerprints never mix
across tests sharing the module's proxy.
"""

from __future__ import annotations

import datetime as dt
import uuid
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.e2e.packs.harness import PackRun, Seen, State, pack_run

POST = "/api/chat.postMessage"
HISTORY = "/api/conversations.history"
TOKEN = "Bearer xoxb-2718281828-3141592653-FakeTestTokenNotReal"


@pytest.fixture(scope="module")
def slack(tmp_path_factory, confdir):
    yield from pack_run("slack.yaml", tmp_path_factory.mktemp("slack"), confdir, headers={"Authorization": TOKEN})


def fresh() -> tuple[str, str]:
    """A channel id and a message text of this test's own."""
    tag = uuid.uuid4().hex[:10].upper()
    return f"C{tag}", f"deploy {tag} finished"


def posts(run: PackRun, marker: str) -> list[Seen]:
    """The chat.postMessage writes the fake received that carry `marker` (JSON or form body)."""
    return [s for s in run.api.requests("POST") if s.path == POST and marker.encode() in s.body]


def reads(run: PackRun, channel: str) -> list[Seen]:
    return [
        s
        for s in run.api.requests("GET")
        if s.path.startswith(HISTORY + "?") and parse_qs(urlsplit(s.path).query).get("channel") == [channel]
    ]


to_states = PackRun.states


def answer_ok(channel: str, ts: str):
    return lambda seen: (
        200,
        {},
        {"ok": True, "channel": channel, "ts": ts, "message": {"type": "message", "text": "x", "ts": ts}},
    )


def history(*messages: dict, ok: bool = True):
    return {"ok": ok, "messages": list(messages), "has_more": False}


# --- outcomes of the write -------------------------------------------------------------------


def test_ok_true_succeeds_with_channel_and_ts_as_external_id(slack):
    channel, text = fresh()
    slack.api.on("POST", POST, answer_ok(channel, "1712345678.000100"))
    r = slack.send("POST", POST, json={"channel": channel, "text": text})
    assert r.status_code == 200 and r.json()["ok"] is True
    assert r.headers["x-receipt-state"] == "succeeded"
    receipt = slack.receipt(r)
    assert receipt.state is State.SUCCEEDED
    assert receipt.external_id == f"{channel}:1712345678.000100"
    assert len(posts(slack, text)) == 1


def test_form_encoded_post_is_fingerprinted_by_its_fields(slack):
    """Slack's Node SDK sends forms: channel/text/thread_ts identify it, other fields do not."""
    channel, text = fresh()
    slack.api.on("POST", POST, answer_ok(channel, "1712345678.000200"))
    first = slack.send("POST", POST, data={"channel": channel, "text": text})
    assert first.headers["x-receipt-state"] == "succeeded"
    assert slack.receipt(first).external_id == f"{channel}:1712345678.000200"
    again = slack.send("POST", POST, data={"channel": channel, "text": text, "unfurl_links": "false"})
    assert again.headers.get("x-receipt-replayed") == "true"
    assert again.headers["x-receipt-id"] == first.headers["x-receipt-id"]
    assert again.json()["ts"] == "1712345678.000200"
    other_thread = slack.send("POST", POST, data={"channel": channel, "text": text, "thread_ts": "1712345600.000001"})
    assert other_thread.headers["x-receipt-id"] != first.headers["x-receipt-id"]
    assert len(posts(slack, text.replace(" ", "+"))) == 2  # the replay was not sent


@pytest.mark.parametrize(
    "error",
    [
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "msg_too_long",
        "no_text",
        "invalid_auth",
        "ratelimited",
        "request_timeout",
    ],
)
def test_ok_false_errors_are_rejections(slack, error):
    channel, text = fresh()
    slack.api.on("POST", POST, 200, {"ok": False, "error": error}, times=1)
    r = slack.send("POST", POST, json={"channel": channel, "text": text})
    assert r.status_code == 200 and r.json() == {"ok": False, "error": error}  # the agent sees Slack's answer
    assert r.headers["x-receipt-state"] == "rejected"
    assert slack.receipt(r).state is State.REJECTED
    # A rejection settles the attempt: the same post may be sent again.
    slack.api.on("POST", POST, answer_ok(channel, "1712345678.000300"), times=1)
    again = slack.send("POST", POST, json={"channel": channel, "text": text})
    assert again.headers["x-receipt-state"] == "succeeded"
    assert slack.receipt(again).retry_of == r.headers["x-receipt-id"]
    assert len(posts(slack, text)) == 2


def test_http_429_rate_limit_is_a_rejection(slack):
    channel, text = fresh()
    slack.api.on("POST", POST, 429, {"ok": False, "error": "ratelimited"}, headers={"Retry-After": "1"}, times=1)
    r = slack.send("POST", POST, json={"channel": channel, "text": text})
    assert r.status_code == 429 and r.headers["x-receipt-state"] == "rejected"
    assert slack.receipt(r).state is State.REJECTED


@pytest.mark.parametrize("error", ["internal_error", "fatal_error", "service_unavailable"])
def test_errors_that_may_have_posted_leave_the_outcome_unknown(slack, error):
    channel, text = fresh()
    slack.api.on("POST", POST, 200, {"ok": False, "error": error}, times=1)
    r = slack.send("POST", POST, json={"channel": channel, "text": text})
    assert r.status_code == 200 and r.json()["error"] == error
    assert r.headers["x-receipt-state"] == "outcome_unknown"
    receipt = slack.receipt(r)
    assert receipt.state is State.OUTCOME_UNKNOWN and receipt.external_id is None
    assert len(posts(slack, text)) == 1


def test_a_200_without_ok_is_not_taken_for_success(slack):
    channel, text = fresh()
    slack.api.on("POST", POST, 200, "<html>gateway</html>", times=1)
    r = slack.send("POST", POST, json={"channel": channel, "text": text})
    assert r.headers["x-receipt-state"] == "outcome_unknown"


@pytest.mark.parametrize("status", [500, 503])
def test_5xx_is_unknown(slack, status):
    channel, text = fresh()
    slack.api.on("POST", POST, status, "upstream trouble", times=1)
    r = slack.send("POST", POST, json={"channel": channel, "text": text})
    assert r.status_code == status and r.headers["x-receipt-state"] == "outcome_unknown"
    assert slack.receipt(r).state is State.OUTCOME_UNKNOWN


def test_dropped_connection_is_unknown(slack):
    channel, text = fresh()
    slack.api.drop("POST", POST)
    r = slack.send("POST", POST, json={"channel": channel, "text": text})
    assert r.status_code == 502 and r.json()["error"] == "outcome_unknown"
    assert r.headers["x-receipt-state"] == "outcome_unknown"
    assert slack.receipt(r).state is State.OUTCOME_UNKNOWN
    assert len(posts(slack, text)) == 1  # the fake did receive the write


# --- reconcile -------------------------------------------------------------------------------


def test_retry_after_internal_error_finds_the_message_and_does_not_post_again(slack):
    channel, text = fresh()
    slack.api.on("POST", POST, 200, {"ok": False, "error": "internal_error"}, times=1)
    first = slack.send("POST", POST, json={"channel": channel, "text": text})
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    slack.api.on(
        "GET",
        HISTORY,
        200,
        history(
            {"type": "message", "text": f"not {text}", "ts": "1712345678.000401"},
            {"type": "message", "text": text, "ts": "1712345678.000402", "bot_id": "B0FAKE"},
        ),
    )
    retry = slack.send("POST", POST, json={"channel": channel, "text": text})

    assert len(posts(slack, text)) == 1  # the retry was not sent
    [read] = reads(slack, channel)
    assert read.headers["authorization"] == TOKEN  # the read runs with the retry's own token
    query = parse_qs(urlsplit(read.path).query)
    submitted = dt.datetime.fromisoformat(slack.receipt(first).submitted_at.replace("Z", "+00:00")).timestamp()
    assert abs(float(query["oldest"][0]) - submitted) < 1.0  # only messages since the attempt
    assert query["inclusive"] == ["true"]

    receipt = slack.receipt(first)
    assert receipt.state is State.SUCCEEDED
    assert receipt.external_id == f"{channel}:1712345678.000402"  # the channel from the request, ts from history
    assert State.RECONCILING in to_states(slack, receipt.operation_id)
    assert retry.headers["x-receipt-id"] == first.headers["x-receipt-id"]
    assert retry.headers["x-receipt-state"] == "succeeded"


def test_retry_of_a_message_found_posted_is_not_told_that_slack_failed(slack):
    """The recorded answer was Slack's internal_error: it must not be replayed as the success."""
    channel, text = fresh()
    slack.api.on("POST", POST, 200, {"ok": False, "error": "internal_error"}, times=1)
    first = slack.send("POST", POST, json={"channel": channel, "text": text})
    slack.api.on("GET", HISTORY, 200, history({"type": "message", "text": text, "ts": "1712345678.000450"}), times=1)
    retry = slack.send("POST", POST, json={"channel": channel, "text": text})
    assert slack.receipt(first).state is State.SUCCEEDED
    assert retry.headers["x-receipt-state"] == "succeeded"
    assert retry.headers.get("x-receipt-replayed") is None
    assert retry.status_code == 409 and retry.json()["error"] == "duplicate_succeeded"
    assert retry.json()["external_id"] == f"{channel}:1712345678.000450"


def test_retry_after_drop_found_gets_the_succeeded_answer(slack):
    channel, text = fresh()
    slack.api.drop("POST", POST)
    first = slack.send("POST", POST, data={"channel": channel, "text": text})
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    slack.api.on("GET", HISTORY, 200, history({"type": "message", "text": text, "ts": "1712345678.000500"}))
    retry = slack.send("POST", POST, data={"channel": channel, "text": text})
    assert retry.status_code == 409 and retry.json()["error"] == "duplicate_succeeded"
    assert retry.json()["external_id"] == f"{channel}:1712345678.000500"
    assert retry.headers["x-receipt-state"] == "succeeded"
    assert len(reads(slack, channel)) == 1
    assert len(posts(slack, text.replace(" ", "+"))) == 1


def test_not_found_is_not_proof_of_absence_manual_review_blocks_retries(slack):
    channel, text = fresh()
    slack.api.on("POST", POST, 200, {"ok": False, "error": "fatal_error"}, times=1)
    first = slack.send("POST", POST, json={"channel": channel, "text": text})
    slack.api.on("GET", HISTORY, 200, history({"type": "message", "text": "someone else", "ts": "1712345678.000601"}))
    retry = slack.send("POST", POST, json={"channel": channel, "text": text})
    assert retry.status_code == 409 and retry.json()["error"] == "duplicate_unresolved"
    assert retry.headers["x-receipt-state"] == "manual_review"
    receipt = slack.receipt(first)
    assert receipt.state is State.MANUAL_REVIEW
    assert to_states(slack, receipt.operation_id)[-2:] == [State.RECONCILING, State.MANUAL_REVIEW]
    third = slack.send("POST", POST, json={"channel": channel, "text": text})
    assert third.status_code == 409
    assert len(posts(slack, text)) == 1
    assert len(reads(slack, channel)) == 1  # manual_review waits for a human: no second read


@pytest.mark.parametrize(
    "answer",
    [
        (200, {"ok": False, "error": "missing_scope", "needed": "channels:history"}),
        (200, {"ok": False, "error": "ratelimited"}),
        (429, {"ok": False, "error": "ratelimited"}),
    ],
)
def test_a_failed_history_read_is_never_taken_as_absence(slack, answer):
    channel, text = fresh()
    slack.api.drop("POST", POST)
    first = slack.send("POST", POST, json={"channel": channel, "text": text})
    status, body = answer
    slack.api.on("GET", HISTORY, status, body, times=1)
    retry = slack.send("POST", POST, json={"channel": channel, "text": text})
    # Nothing proven: the outcome stays unknown and is read again later, never posted again.
    assert retry.status_code == 409 and retry.headers["x-receipt-state"] == "outcome_unknown"
    assert int(retry.headers["retry-after"]) >= 1
    assert slack.receipt(first).state is State.OUTCOME_UNKNOWN
    assert len(reads(slack, channel)) == 1
    assert len(posts(slack, text)) == 1
