"""
The email packs against fake APIs: rules/resend.yaml, rules/postmark.yaml and
rules/sendgrid.yaml, one module-scoped proxy each.

- Resend: the proxy adds an Idempotency-Key, so an unknown outcome is safe to retry
  with the same key (no read); 409 concurrent_idempotent_requests is outcome_unknown (the
  retry reuses the key); 409 invalid_idempotent_request is already_exists (the receipt
  reconciles with GET /emails at once), never a rejection: the first request with that key
  may have sent the email.
- Postmark: 200 with ErrorCode 0 and MessageID; 422 with an ErrorCode is a rejection;
  the outbound message search can prove success, never absence.
- SendGrid: 202 with an empty body and the id in X-Message-Id; no read at all.

Every test uses its own subject (and recipient), so counts and fingerprints never mix.
"""

from __future__ import annotations

import uuid
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.e2e.packs.harness import PackRun, Seen, State, pack_run


def tag() -> str:
    return uuid.uuid4().hex[:10]


def writes(run: PackRun, path: str, marker: str) -> list[Seen]:
    """The POSTs to `path` the fake received whose body carries `marker`."""
    return [s for s in run.api.requests("POST") if s.path.split("?")[0] == path and marker.encode() in s.body]


def gets(run: PackRun, path: str, marker: str = "") -> list[Seen]:
    return [s for s in run.api.requests("GET") if s.path.split("?")[0] == path and marker in s.path]


def to_states(run: PackRun, operation_id: str) -> list[State]:
    store = run.store()
    try:
        return [e.to_state for e in store.events(operation_id)]
    finally:
        store.close()


# =============================================================================================
# Resend
# =============================================================================================

RESEND_KEY = "Bearer re_FakeTest_4f9a2c71d3b84e0a9d1c"
EMAILS = "/emails"


@pytest.fixture(scope="module")
def resend(tmp_path_factory, confdir):
    yield from pack_run(
        "resend.yaml", tmp_path_factory.mktemp("resend"), confdir, headers={"Authorization": RESEND_KEY}
    )


def resend_email(t: str) -> dict:
    return {
        "from": "Acme <onboarding@acme.test>",
        "to": [f"user-{t}@example.com"],
        "subject": f"Your order {t}",
        "html": f"<p>order {t} confirmed</p>",
    }


def resend_listing(email: dict, email_id: str, *others: dict) -> dict:
    item = {
        "id": email_id,
        "to": email["to"],
        "from": email["from"],
        "created_at": "2026-03-01T12:00:01.000000+00:00",
        "subject": email["subject"],
        "bcc": None,
        "cc": None,
        "reply_to": None,
        "last_event": "sent",
        "scheduled_at": None,
    }
    return {"object": "list", "has_more": False, "data": [*others, item]}


def resend_error(status: int, name: str, message: str) -> tuple[int, dict]:
    return status, {"statusCode": status, "name": name, "message": message}


def test_resend_success_records_id_and_sends_the_receipts_idempotency_key(resend):
    t = tag()
    resend.api.on("POST", EMAILS, 200, {"id": f"email-{t}"}, times=1)
    r = resend.send("POST", EMAILS, json=resend_email(t))
    assert r.status_code == 200 and r.headers["x-receipt-state"] == "succeeded"
    receipt = resend.receipt(r)
    assert receipt.state is State.SUCCEEDED and receipt.external_id == f"email-{t}"
    [sent] = writes(resend, EMAILS, t)
    assert receipt.idempotency_key and sent.headers["idempotency-key"] == receipt.idempotency_key
    assert 1 <= len(receipt.idempotency_key) <= 256  # Resend's limit


def test_resend_gets_the_receipts_idempotency_key_in_place_of_the_agents(resend):
    t = tag()
    resend.api.on("POST", EMAILS, 200, {"id": f"email-{t}"}, times=1)
    r = resend.send("POST", EMAILS, json=resend_email(t), headers={"Idempotency-Key": f"welcome-user/{t}"})
    assert r.headers["x-receipt-state"] == "succeeded"
    [sent] = writes(resend, EMAILS, t)
    key = resend.receipt(r).idempotency_key
    assert sent.headers["idempotency-key"] == key == r.headers["x-receipt-idempotency-key"] != f"welcome-user/{t}"


@pytest.mark.parametrize(
    "error",
    [
        resend_error(422, "missing_required_field", "Missing `to` field."),
        resend_error(400, "validation_error", "Invalid `to` field."),
        resend_error(429, "rate_limit_exceeded", "Too many requests."),
        resend_error(429, "daily_quota_exceeded", "You have reached your daily email sending quota."),
    ],
    ids=lambda e: e[1]["name"],
)
def test_resend_rejections(resend, error):
    t = tag()
    status, body = error
    resend.api.on("POST", EMAILS, status, body, times=1)
    r = resend.send("POST", EMAILS, json=resend_email(t))
    assert r.status_code == status and r.json()["name"] == body["name"]
    assert r.headers["x-receipt-state"] == "rejected"
    assert resend.receipt(r).state is State.REJECTED


@pytest.mark.parametrize("fault", ["500", "drop"])
def test_resend_unknown_outcome_is_retried_with_the_same_key_without_a_read(resend, fault):
    t = tag()
    reads_before = len(gets(resend, EMAILS))
    if fault == "drop":
        resend.api.drop("POST", EMAILS)
    else:
        resend.api.on("POST", EMAILS, *resend_error(500, "application_error", "Something went wrong."), times=1)
    first = resend.send("POST", EMAILS, json=resend_email(t))
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    assert resend.receipt(first).state is State.OUTCOME_UNKNOWN

    resend.api.on("POST", EMAILS, 200, {"id": f"email-{t}"}, times=1)  # Resend answers the original, deduplicated
    retry = resend.send("POST", EMAILS, json=resend_email(t))
    assert retry.status_code == 200 and retry.headers["x-receipt-state"] == "succeeded"
    assert resend.receipt(first).state is State.SAFE_TO_RETRY
    second = resend.receipt(retry)
    assert second.retry_of == first.headers["x-receipt-id"] and second.external_id == f"email-{t}"
    sent = writes(resend, EMAILS, t)
    assert len(sent) == 2
    assert sent[0].headers["idempotency-key"] == sent[1].headers["idempotency-key"] == second.idempotency_key
    assert len(gets(resend, EMAILS)) == reads_before  # the key made it safe: no read


INVALID_IDEMPOTENT = ("invalid_idempotent_request", "Same idempotency key used with a different request payload.")
CONCURRENT = (
    "concurrent_idempotent_requests",
    "Same idempotency key used while original request is still in progress.",
)


def test_resend_invalid_idempotent_request_reconciles_and_finds_the_email(resend):
    t = tag()
    email = resend_email(t)
    resend.api.on("POST", EMAILS, *resend_error(409, *INVALID_IDEMPOTENT), times=1)
    resend.api.on(
        "GET",
        EMAILS,
        200,
        resend_listing(
            email,
            f"email-{t}",
            {"id": "someone-else", "to": ["other@example.com"], "from": email["from"], "subject": email["subject"]},
        ),
        times=1,
    )
    r = resend.send("POST", EMAILS, json=email)
    assert r.status_code == 409 and r.json()["name"] == "invalid_idempotent_request"  # the API's answer

    [read] = gets(resend, EMAILS, "limit=100")[-1:]
    assert read.headers["authorization"] == RESEND_KEY
    receipt = resend.receipt(r)
    assert receipt.state is State.SUCCEEDED and receipt.external_id == f"email-{t}"
    assert r.headers["x-receipt-state"] == "succeeded"
    assert State.RECONCILING in to_states(resend, receipt.operation_id)
    assert len(writes(resend, EMAILS, t)) == 1
    assert r.headers["x-receipt-external-id"] == f"email-{t}"
    again = resend.send("POST", EMAILS, json=email)  # the email exists: not sent again, the 409 not replayed
    assert again.headers["x-receipt-id"] == r.headers["x-receipt-id"]
    assert again.status_code == 409 and again.json()["error"] == "duplicate_succeeded"
    assert again.json()["external_id"] == f"email-{t}"
    assert len(writes(resend, EMAILS, t)) == 1


def test_resend_invalid_idempotent_request_not_listed_goes_to_manual_review(resend):
    t = tag()
    email = resend_email(t)
    resend.api.on("POST", EMAILS, *resend_error(409, *INVALID_IDEMPOTENT), times=1)
    resend.api.on("GET", EMAILS, 200, {"object": "list", "has_more": True, "data": []}, times=1)
    r = resend.send("POST", EMAILS, json=email)
    receipt = resend.receipt(r)
    assert receipt.state is State.MANUAL_REVIEW
    assert to_states(resend, receipt.operation_id)[-2:] == [State.RECONCILING, State.MANUAL_REVIEW]
    assert r.headers["x-receipt-state"] == "manual_review"
    retry = resend.send("POST", EMAILS, json=email)
    assert retry.status_code == 409 and retry.json()["error"] == "duplicate_unresolved"
    assert len(writes(resend, EMAILS, t)) == 1


def test_resend_invalid_idempotent_request_on_a_retry_never_gets_a_fresh_key(resend):
    """
    The first send is lost (outcome unknown); the retry within 24 h reuses its key and differs
    outside the fingerprint, so Resend answers invalid_idempotent_request: the first request
    reached Resend and may have sent the email. Not a refusal: no attempt after it goes out
    with a fresh key (that would be a second email).
    """
    t = tag()
    email = resend_email(t)
    resend.api.drop("POST", EMAILS)
    first = resend.send("POST", EMAILS, json=email)
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    resend.api.on("POST", EMAILS, *resend_error(409, *INVALID_IDEMPOTENT), times=1)
    resend.api.on("GET", EMAILS, 200, {"object": "list", "has_more": False, "data": []}, times=1)
    retry = resend.send("POST", EMAILS, json={**email, "tags": [{"name": "attempt", "value": "2"}]})
    assert retry.status_code == 409 and retry.json()["name"] == "invalid_idempotent_request"
    second = resend.receipt(retry)
    assert second.retry_of == first.headers["x-receipt-id"]
    assert second.state is not State.REJECTED and second.state is State.MANUAL_REVIEW  # not listed: not provable
    assert State.REJECTED not in to_states(resend, second.operation_id)
    third = resend.send("POST", EMAILS, json=email)
    assert third.status_code == 409 and third.json()["error"] == "duplicate_unresolved"
    sent = writes(resend, EMAILS, t)
    assert len(sent) == 2  # the lost one and the retry with its key; never a third with a new key
    assert {s.headers["idempotency-key"] for s in sent} == {resend.receipt(first).idempotency_key}


def test_resend_concurrent_idempotent_request_is_unknown_and_the_retry_reuses_the_key(resend):
    t = tag()
    email = resend_email(t)
    reads_before = len(gets(resend, EMAILS))
    resend.api.on("POST", EMAILS, *resend_error(409, *CONCURRENT), times=1)
    first = resend.send("POST", EMAILS, json=email)
    assert first.status_code == 409 and first.json()["name"] == "concurrent_idempotent_requests"
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    assert resend.receipt(first).state is State.OUTCOME_UNKNOWN
    resend.api.on("POST", EMAILS, 200, {"id": f"email-{t}"}, times=1)  # Resend answers from the first request
    retry = resend.send("POST", EMAILS, json=email)
    assert retry.status_code == 200 and retry.headers["x-receipt-state"] == "succeeded"
    assert resend.receipt(first).state is State.SAFE_TO_RETRY
    sent = writes(resend, EMAILS, t)
    assert len(sent) == 2 and sent[0].headers["idempotency-key"] == sent[1].headers["idempotency-key"]
    assert len(gets(resend, EMAILS)) == reads_before  # within the key's 24 h: no read needed


def test_resend_email_on_the_second_page_of_the_list_is_found_without_a_second_send(resend):
    """rules/resend.yaml follows GET /emails's pages (has_more, after = the last email's id;
    issue 16): a 409 invalid_idempotent_request, then a first page of 100 other emails that
    says has_more, and the email on page 2 → succeeded, one send. (Before, the first page's
    has_more was not followed and proved nothing: manual review.)"""
    t = tag()
    email = resend_email(t)
    others = [
        {"id": f"other-{t}-{i:03d}", "to": ["other@example.com"], "from": email["from"], "subject": "something else"}
        for i in range(100)
    ]

    def page(seen: Seen):
        after = parse_qs(urlsplit(seen.path).query).get("after", [None])[0]
        if after is None:
            return 200, {}, {"object": "list", "has_more": True, "data": others}
        return 200, {}, resend_listing(email, f"email-{t}")

    reads_before = len(gets(resend, EMAILS))
    resend.api.on("POST", EMAILS, *resend_error(409, *INVALID_IDEMPOTENT), times=1)
    resend.api.on("GET", EMAILS, page, times=2)
    r = resend.send("POST", EMAILS, json=email)
    assert r.status_code == 409 and r.json()["name"] == "invalid_idempotent_request"
    receipt = resend.receipt(r)
    assert (receipt.state, receipt.external_id) == (State.SUCCEEDED, f"email-{t}")
    walked = gets(resend, EMAILS)[reads_before:]
    assert len(walked) == 2
    assert parse_qs(urlsplit(walked[1].path).query) == {"limit": ["100"], "after": [f"other-{t}-099"]}
    assert walked[1].headers["authorization"] == RESEND_KEY
    again = resend.send("POST", EMAILS, json=email)
    assert again.status_code == 409 and again.json()["error"] == "duplicate_succeeded"
    assert len(writes(resend, EMAILS, t)) == 1  # no second email


# =============================================================================================
# Postmark
# =============================================================================================

POSTMARK_TOKEN = "f3c1a9e2-7b4d-4c8e-9a15-FAKE0TEST0TOKEN"
PM_EMAIL = "/email"
PM_SEARCH = "/messages/outbound"


@pytest.fixture(scope="module")
def postmark(tmp_path_factory, confdir):
    yield from pack_run(
        "postmark.yaml",
        tmp_path_factory.mktemp("postmark"),
        confdir,
        headers={"X-Postmark-Server-Token": POSTMARK_TOKEN, "Accept": "application/json"},
    )


def pm_email(t: str) -> dict:
    return {
        "From": "sender@acme.test",
        "To": f"rcpt-{t}@example.com",
        "Subject": f"Invoice {t}",
        "TextBody": f"invoice {t}",
        "MessageStream": "outbound",
    }


def pm_sent(email: dict, message_id: str) -> dict:
    return {
        "To": email["To"],
        "SubmittedAt": "2026-03-01T07:00:01.1794748-05:00",
        "MessageID": message_id,
        "ErrorCode": 0,
        "Message": "OK",
    }


def pm_search(*messages: dict) -> dict:
    return {"TotalCount": len(messages), "Messages": list(messages)}


def pm_item(email: dict, message_id: str, subject: str | None = None) -> dict:
    return {
        "Tag": "",
        "MessageID": message_id,
        "MessageStream": "outbound",
        "To": [{"Email": email["To"], "Name": None}],
        "Cc": [],
        "Bcc": [],
        "Recipients": [email["To"]],
        "ReceivedAt": "2026-03-01T07:00:01-05:00",
        "From": email["From"],
        "Subject": subject or email["Subject"],
        "Attachments": [],
        "Status": "Sent",
        "TrackOpens": False,
        "TrackLinks": "None",
        "Metadata": {},
        "Sandboxed": False,
    }


def test_postmark_success_records_message_id(postmark):
    t = tag()
    email = pm_email(t)
    postmark.api.on("POST", PM_EMAIL, 200, pm_sent(email, f"msg-{t}"), times=1)
    r = postmark.send("POST", PM_EMAIL, json=email)
    assert r.status_code == 200 and r.headers["x-receipt-state"] == "succeeded"
    receipt = postmark.receipt(r)
    assert receipt.state is State.SUCCEEDED and receipt.external_id == f"msg-{t}"
    assert len(writes(postmark, PM_EMAIL, t)) == 1


@pytest.mark.parametrize(
    "code,message,reason",
    [
        (406, "You tried to send to recipient(s) that have been marked as inactive.", "inactive recipient"),
        (300, "Invalid 'To' address: 'not-an-address'.", "invalid email request"),
        (405, "Not allowed to send: you have run out of credits.", "422 with an API error code"),
        (401, "Sender signature not confirmed.", "422 with an API error code"),
    ],
)
def test_postmark_422_error_codes_are_rejections(postmark, code, message, reason):
    t = tag()
    postmark.api.on("POST", PM_EMAIL, 422, {"ErrorCode": code, "Message": message}, times=1)
    r = postmark.send("POST", PM_EMAIL, json=pm_email(t))
    assert r.status_code == 422 and r.json()["ErrorCode"] == code
    assert r.headers["x-receipt-state"] == "rejected"
    assert postmark.receipt(r).state is State.REJECTED
    assert any(reason in why for why in postmark.reasons(r)), postmark.reasons(r)


@pytest.mark.parametrize("status", [401, 429])
def test_postmark_other_4xx_are_rejections(postmark, status):
    t = tag()
    postmark.api.on("POST", PM_EMAIL, status, {"ErrorCode": 10 if status == 401 else 429, "Message": "no"}, times=1)
    r = postmark.send("POST", PM_EMAIL, json=pm_email(t))
    assert r.headers["x-receipt-state"] == "rejected"


def test_postmark_500_then_retry_finds_the_message_and_does_not_send_again(postmark):
    t = tag()
    email = pm_email(t)
    postmark.api.on("POST", PM_EMAIL, 500, "Internal Server Error", times=1)
    first = postmark.send("POST", PM_EMAIL, json=email)
    assert first.status_code == 500 and first.headers["x-receipt-state"] == "outcome_unknown"

    postmark.api.on("GET", PM_SEARCH, 200, pm_search(pm_item(email, f"msg-{t}")), times=1)
    retry = postmark.send("POST", PM_EMAIL, json=email)
    assert retry.headers["x-receipt-id"] == first.headers["x-receipt-id"]
    assert retry.headers["x-receipt-state"] == "succeeded"
    [read] = gets(postmark, PM_SEARCH, t)
    assert read.headers["x-postmark-server-token"] == POSTMARK_TOKEN
    assert read.headers["accept"] == "application/json"  # the rule's read.headers
    query = parse_qs(urlsplit(read.path).query)
    assert query["recipient"] == [email["To"]] and query["subject"] == [email["Subject"]]
    assert query["count"] == ["50"] and query["offset"] == ["0"]
    assert retry.status_code == 409 and retry.json()["external_id"] == f"msg-{t}"  # the 500 is not replayed
    receipt = postmark.receipt(first)
    assert receipt.state is State.SUCCEEDED and receipt.external_id == f"msg-{t}"
    assert State.RECONCILING in to_states(postmark, receipt.operation_id)
    assert len(writes(postmark, PM_EMAIL, t)) == 1


def test_postmark_dropped_then_not_found_is_manual_review_and_blocks(postmark):
    t = tag()
    email = pm_email(t)
    postmark.api.drop("POST", PM_EMAIL)
    first = postmark.send("POST", PM_EMAIL, json=email)
    assert first.status_code == 502 and first.headers["x-receipt-state"] == "outcome_unknown"
    # Only another subject to this recipient: absence is still not proven.
    postmark.api.on("GET", PM_SEARCH, 200, pm_search(pm_item(email, "msg-other", subject="Welcome")), times=1)
    retry = postmark.send("POST", PM_EMAIL, json=email)
    assert retry.status_code == 409 and retry.headers["x-receipt-state"] == "manual_review"
    assert postmark.receipt(first).state is State.MANUAL_REVIEW
    again = postmark.send("POST", PM_EMAIL, json=email)
    assert again.status_code == 409
    assert len(writes(postmark, PM_EMAIL, t)) == 1
    assert len(gets(postmark, PM_SEARCH, t)) == 1


# =============================================================================================
# SendGrid
# =============================================================================================

SENDGRID_KEY = "Bearer SG.FakeTestKey0123456789.abcdefghijklmnopqrstuvwxyz0123456789ABCD"
SEND = "/v3/mail/send"


@pytest.fixture(scope="module")
def sendgrid(tmp_path_factory, confdir):
    yield from pack_run(
        "sendgrid.yaml", tmp_path_factory.mktemp("sendgrid"), confdir, headers={"Authorization": SENDGRID_KEY}
    )


def sg_mail(t: str) -> dict:
    return {
        "personalizations": [{"to": [{"email": f"rcpt-{t}@example.com"}]}],
        "from": {"email": "sender@acme.test"},
        "subject": f"Report {t}",
        "content": [{"type": "text/plain", "value": f"report {t}"}],
    }


def test_sendgrid_202_empty_body_takes_the_id_from_x_message_id(sendgrid):
    t = tag()
    sendgrid.api.on("POST", SEND, 202, b"", headers={"X-Message-Id": f"sgid-{t}"}, times=1)
    r = sendgrid.send("POST", SEND, json=sg_mail(t))
    assert r.status_code == 202 and r.content == b""
    assert r.headers["x-receipt-state"] == "succeeded"
    receipt = sendgrid.receipt(r)
    assert receipt.state is State.SUCCEEDED and receipt.external_id == f"sgid-{t}"
    again = sendgrid.send("POST", SEND, json=sg_mail(t))  # a duplicate gets the recorded answer, id header included
    assert again.headers.get("x-receipt-replayed") == "true" and again.headers["x-message-id"] == f"sgid-{t}"
    assert len(writes(sendgrid, SEND, t)) == 1


@pytest.mark.parametrize("status", [400, 401, 403, 413, 429])
def test_sendgrid_4xx_are_rejections(sendgrid, status):
    t = tag()
    sendgrid.api.on("POST", SEND, status, {"errors": [{"field": "from", "message": "refused"}]}, times=1)
    r = sendgrid.send("POST", SEND, json=sg_mail(t))
    assert r.status_code == status and r.headers["x-receipt-state"] == "rejected"
    assert sendgrid.receipt(r).state is State.REJECTED


@pytest.mark.parametrize("fault", ["500", "503", "drop"])
def test_sendgrid_unknown_outcome_blocks_retries_without_any_read(sendgrid, fault):
    t = tag()
    if fault == "drop":
        sendgrid.api.drop("POST", SEND)
    else:
        sendgrid.api.on("POST", SEND, int(fault), {"errors": [{"message": "server error"}]}, times=1)
    first = sendgrid.send("POST", SEND, json=sg_mail(t))
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    reads_before = len(sendgrid.api.requests("GET"))
    retry = sendgrid.send("POST", SEND, json=sg_mail(t))
    assert retry.status_code == 409 and retry.json()["error"] == "duplicate_unresolved"
    assert retry.headers["x-receipt-id"] == first.headers["x-receipt-id"]
    receipt = sendgrid.receipt(first)
    assert receipt.state is State.OUTCOME_UNKNOWN and receipt.external_id is None
    assert len(sendgrid.api.requests("GET")) == reads_before  # no read: nothing can prove anything
    assert len(writes(sendgrid, SEND, t)) == 1


def test_sendgrid_two_subusers_are_two_principals_and_one_subuser_twice_is_one_send(sendgrid):
    t = tag()
    sendgrid.api.on(
        "POST", SEND, lambda seen: (202, {"X-Message-Id": f"sgid-{seen.headers.get('on-behalf-of')}-{t}"}, b""), times=2
    )
    a1 = sendgrid.send("POST", SEND, json=sg_mail(t), headers={"on-behalf-of": "subuser-a"})
    b1 = sendgrid.send("POST", SEND, json=sg_mail(t), headers={"on-behalf-of": "subuser-b"})
    assert (a1.headers["x-receipt-state"], b1.headers["x-receipt-state"]) == ("succeeded", "succeeded")
    assert "x-receipt-replayed" not in b1.headers  # two subusers: two sends allowed
    ra, rb = sendgrid.receipt(a1), sendgrid.receipt(b1)
    assert ra.operation_id != rb.operation_id and ra.principal != rb.principal
    assert (ra.external_id, rb.external_id) == (f"sgid-subuser-a-{t}", f"sgid-subuser-b-{t}")
    a2 = sendgrid.send("POST", SEND, json=sg_mail(t), headers={"on-behalf-of": "subuser-a"})
    assert a2.headers.get("x-receipt-replayed") == "true" and a2.headers["x-message-id"] == f"sgid-subuser-a-{t}"
    sent = writes(sendgrid, SEND, t)
    assert [s.headers.get("on-behalf-of") for s in sent] == ["subuser-a", "subuser-b"]  # one subuser twice: one send
