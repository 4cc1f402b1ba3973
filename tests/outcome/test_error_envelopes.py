"""
The proxy's own answers in an API's error envelope (proxy_addon/outcome/error_envelopes.py): each
envelope's shape, a message that carries the explanation and the receipt id, the plain answer kept
whole under `receipt_proxy`, a replay never wrapped, and nothing in the envelope the plain answer
did not hold; a rules file's own template filled in (placeholders, escapes, numbers) likewise.
Receipts come from a real store (tests/outcome/test_http_answers.py).
"""

from __future__ import annotations

import json

import pytest

from proxy_addon.outcome import error_envelopes
from proxy_addon.outcome import http_answers as answers
from proxy_addon.outcome.http_answers import Answer
from proxy_addon.rules import error_templates, load_rules
from proxy_addon.rules.model import ERROR_ENVELOPES
from proxy_addon.states import State
from proxy_addon.store import RecordedResponse
from tests.outcome.test_http_answers import receipt_in, store  # noqa: F401  (a fixture)


def body(a: Answer) -> dict:
    return json.loads(a.body)


def blocked(store_) -> tuple[Answer, str]:
    receipt = receipt_in(store_, State.OUTCOME_UNKNOWN)
    return answers.duplicate(receipt, "blocked"), receipt.operation_id


def test_openai_envelope(store):  # noqa: F811
    plain, op_id = blocked(store)
    a = error_envelopes.in_envelope(plain, "openai")
    doc = body(a)
    assert set(doc) == {"error"}
    err = doc["error"]
    assert err["type"] == "invalid_request_error"
    assert err["code"] == "duplicate_unresolved"
    assert err["param"] is None
    assert op_id in err["message"] and "reconcile it before retrying" in err["message"]
    assert err["receipt_proxy"] == body(plain)  # the proxy's whole answer, under one key
    assert a.status == 409
    assert dict(a.headers)["X-Receipt-Id"] == op_id
    assert dict(a.headers)["content-length"] == str(len(a.body))


def test_anthropic_envelope(store):  # noqa: F811
    plain, op_id = blocked(store)
    doc = body(error_envelopes.in_envelope(plain, "anthropic"))
    assert doc["type"] == "error" and set(doc) == {"type", "error"}
    assert doc["error"]["type"] == "invalid_request_error"
    assert op_id in doc["error"]["message"] and "duplicate_unresolved" in doc["error"]["message"]
    assert doc["error"]["receipt_proxy"]["operation_id"] == op_id


def test_stripe_envelope(store):  # noqa: F811
    plain, op_id = blocked(store)
    doc = body(error_envelopes.in_envelope(plain, "stripe"))
    assert set(doc) == {"error"}
    assert doc["error"]["type"] == "invalid_request_error" and doc["error"]["code"] == "duplicate_unresolved"
    assert op_id in doc["error"]["message"]
    assert doc["error"]["receipt_proxy"]["state"] == "outcome_unknown"
    reused = answers.duplicate(receipt_in(store, State.SUCCEEDED), "key_conflict")
    assert body(error_envelopes.in_envelope(reused, "stripe"))["error"]["type"] == "idempotency_error"


def test_github_envelope(store):  # noqa: F811
    plain, op_id = blocked(store)
    doc = body(error_envelopes.in_envelope(plain, "github"))
    assert op_id in doc["message"] and "documentation_url" in doc and doc["status"] == "409"
    assert doc["receipt_proxy"] == body(plain)


def test_plain_is_todays_answer(store):  # noqa: F811
    plain, _ = blocked(store)
    assert error_envelopes.in_envelope(plain, "plain") == plain


def test_replay_is_never_wrapped(store):  # noqa: F811
    rec = RecordedResponse(status=201, headers=[("Content-Type", "application/json")], body=b'{"id": "42"}')
    receipt = receipt_in(store, State.SUCCEEDED, response=rec)
    replayed = answers.replay(receipt, rec)
    for errors in ERROR_ENVELOPES:
        assert error_envelopes.in_envelope(replayed, errors) == replayed


@pytest.mark.parametrize("errors", [e for e in ERROR_ENVELOPES if e != "plain"])
def test_every_answer_in_every_envelope(store, errors):  # noqa: F811
    """Each answer the proxy makes in place of the API: status and headers kept, our fields under receipt_proxy."""
    succeeded = receipt_in(store, State.SUCCEEDED)
    made = [
        answers.duplicate(succeeded, "blocked_succeeded"),
        answers.unavailable("test-api", "things.create", "disk I/O error"),
        answers.denied(receipt_in(store, State.AWAITING_APPROVAL), "denied by alice"),
        answers.bad_json("test-api", "things.create", "key 'title' twice in the body"),
        answers.bad_header("test-api", "things.create", "X-Thing", "has a CR"),
        answers.body_refused("test-api", "things.create", too_large=True, detail="3 MB"),
    ]
    for plain in made:
        wrapped = error_envelopes.in_envelope(plain, errors)
        assert wrapped.status == plain.status
        plain_headers = {k: v for k, v in plain.headers if k != "content-length"}
        retry = {"x-should-retry", "Stripe-Should-Retry"}  # the one header an envelope adds (test below)
        assert {k: v for k, v in wrapped.headers if k not in ("content-length", *retry)} == plain_headers
        doc = body(wrapped)
        ours = doc["receipt_proxy"] if errors == "github" else doc["error"]["receipt_proxy"]
        assert ours == body(plain)
        text = doc["message"] if errors == "github" else doc["error"]["message"]
        assert body(plain)["error"] in text and body(plain)["hint"] in text
        if "operation_id" in body(plain):
            assert body(plain)["operation_id"] in text
        else:
            assert "not sent, no receipt" in text


def _walk(v: object, into: set[str]) -> None:
    if isinstance(v, dict):
        for x in v.values():
            _walk(x, into)
    elif isinstance(v, str):
        into.add(v)


def test_nothing_enters_that_the_plain_answer_did_not_hold(store):  # noqa: F811
    """The envelope adds only text built from the plain answer's own fields: no new values, no secrets."""
    plain, _ = blocked(store)
    for errors in ERROR_ENVELOPES:
        wrapped = body(error_envelopes.in_envelope(plain, errors))
        strings: set[str] = set()
        _walk(wrapped, strings)
        plain_text = json.dumps(body(plain))
        for s in strings:
            if s in error_envelopes.message(body(plain)):
                continue
            assert s in plain_text or s in {
                "error",
                "invalid_request_error",
                "docs/agents.md",
                "409",
            }, s


# --- a rules file's own template (rules/error_templates.py) ---

TEMPLATE = """api: demo
hosts: [api.demo.test]
errors:
  template:
    status: error
    error: {code: "{code}", text: "{message}", http: "{status}", receipt: "{operation_id}", state: "{state}"}
    details: {kind: proxy}
  key: details.receipt_proxy
operations:
  things.create:
    match: {method: POST, path: /things}
"""


def template_errors(text: str = TEMPLATE) -> str:
    """A template as the Operation keeps it: loaded from a rules file."""
    (op,) = load_rules(text, "demo.yaml").operations
    return op.errors


def test_a_template_takes_its_shape_filled_with_the_answers_fields(store):  # noqa: F811
    plain, op_id = blocked(store)
    a = error_envelopes.in_envelope(plain, template_errors())
    doc = body(a)
    assert list(doc) == ["status", "error", "details"]
    assert doc["status"] == "error"
    err = doc["error"]
    assert err["code"] == "duplicate_unresolved"
    assert err["text"] == error_envelopes.message(body(plain))
    assert op_id in err["text"] and "reconcile it before retrying" in err["text"]
    assert err["http"] == 409  # exactly one placeholder of a number: a number
    assert err["receipt"] == op_id and err["state"] == "outcome_unknown"
    assert doc["details"] == {"kind": "proxy", "receipt_proxy": body(plain)}  # beside the template's own
    assert a.status == 409
    assert dict(a.headers)["X-Receipt-Id"] == op_id
    assert dict(a.headers)["content-length"] == str(len(a.body))


def test_a_template_key_defaults_to_receipt_proxy_and_makes_its_mappings(store):  # noqa: F811
    plain, _ = blocked(store)
    default = TEMPLATE.replace("  key: details.receipt_proxy\n", "")
    assert body(error_envelopes.in_envelope(plain, template_errors(default)))["receipt_proxy"] == body(plain)
    deeper = TEMPLATE.replace("key: details.receipt_proxy", "key: meta.proxy.answer")
    assert body(error_envelopes.in_envelope(plain, template_errors(deeper)))["meta"] == {
        "proxy": {"answer": body(plain)}
    }


def test_a_template_escapes_braces_and_writes_numbers_in_text_as_text(store):  # noqa: F811
    plain, _ = blocked(store)
    text = TEMPLATE.replace(
        'text: "{message}"', 'text: "{{code}} is {code}; HTTP {status}; {{{state}}}", n: 7, flag: true'
    )
    err = body(error_envelopes.in_envelope(plain, template_errors(text)))["error"]
    assert err["text"] == "{code} is duplicate_unresolved; HTTP 409; {outcome_unknown}"
    assert err["n"] == 7 and err["flag"] is True


def test_a_template_without_a_receipt_has_null_or_nothing_for_it():
    plain = answers.unavailable("demo", "things.create", "disk I/O error")  # nothing recorded, nothing sent
    text = TEMPLATE.replace('receipt: "{operation_id}"', 'receipt: "{operation_id}", said: "receipt {operation_id}."')
    doc = body(error_envelopes.in_envelope(plain, template_errors(text)))
    assert doc["error"]["receipt"] is None and doc["error"]["state"] is None
    assert doc["error"]["said"] == "receipt ."
    assert doc["error"]["http"] == 503
    assert "not sent, no receipt" in doc["error"]["text"]


def test_a_template_is_never_changed_by_rendering(store):  # noqa: F811
    errors = template_errors()
    first = body(error_envelopes.in_envelope(blocked(store)[0], errors))
    again = body(
        error_envelopes.in_envelope(answers.duplicate(receipt_in(store, State.MANUAL_REVIEW), "blocked"), errors)
    )
    assert first["error"]["receipt"] != again["error"]["receipt"]  # two receipts, each its own
    assert error_templates.parsed(errors)[0]["error"]["code"] == "{code}"
    assert "receipt_proxy" not in error_templates.parsed(errors)[0]["details"]


def test_a_replay_is_never_put_in_a_template(store):  # noqa: F811
    rec = RecordedResponse(status=201, headers=[("Content-Type", "application/json")], body=b'{"id": "42"}')
    replayed = answers.replay(receipt_in(store, State.SUCCEEDED, response=rec), rec)
    assert error_envelopes.in_envelope(replayed, template_errors()) == replayed


def test_every_answer_in_a_template(store):  # noqa: F811
    errors = template_errors()
    for plain in [
        answers.duplicate(receipt_in(store, State.SUCCEEDED), "blocked_succeeded"),
        answers.unavailable("test-api", "things.create", "disk I/O error"),
        answers.denied(receipt_in(store, State.AWAITING_APPROVAL), "denied by alice"),
        answers.bad_header("test-api", "things.create", "X-Thing", "has a CR"),
    ]:
        wrapped = error_envelopes.in_envelope(plain, errors)
        assert wrapped.status == plain.status
        plain_headers = {k: v for k, v in plain.headers if k != "content-length"}
        retry = {"x-should-retry", "Stripe-Should-Retry"}  # the one header an envelope adds (test below)
        assert {k: v for k, v in wrapped.headers if k not in ("content-length", *retry)} == plain_headers
        doc = body(wrapped)
        assert doc["details"]["receipt_proxy"] == body(plain)
        assert doc["error"]["code"] == body(plain)["error"] and doc["error"]["http"] == plain.status
        assert body(plain)["hint"] in doc["error"]["text"]


def test_nothing_enters_a_template_that_the_plain_answer_did_not_hold(store):  # noqa: F811
    plain, _ = blocked(store)
    wrapped = body(error_envelopes.in_envelope(plain, template_errors()))
    strings: set[str] = set()
    _walk(wrapped, strings)
    plain_text = json.dumps(body(plain))
    for s in strings:
        assert s in plain_text or s == error_envelopes.message(body(plain)) or s in {"error", "proxy"}, s


def test_sdks_are_told_not_to_retry_where_sending_again_at_once_cannot_help(store):  # noqa: F811
    plain, _ = blocked(store)  # 409 without Retry-After: an immediate retry is blocked again
    assert dict(error_envelopes.in_envelope(plain, "openai").headers)["x-should-retry"] == "false"
    assert dict(error_envelopes.in_envelope(plain, "anthropic").headers)["x-should-retry"] == "false"
    assert dict(error_envelopes.in_envelope(plain, "stripe").headers)["Stripe-Should-Retry"] == "false"
    assert "x-should-retry" not in dict(error_envelopes.in_envelope(plain, "github").headers)
    assert "x-should-retry" not in dict(error_envelopes.in_envelope(plain, "plain").headers)
    waits = answers.json_answer(409, {"error": "duplicate_unresolved"}, {"Retry-After": "30"})
    assert "x-should-retry" not in dict(error_envelopes.in_envelope(waits, "openai").headers)  # it may settle
    down = answers.unavailable("pay", "charge", "the store is down")  # 503: a retry may find it back
    assert "x-should-retry" not in dict(error_envelopes.in_envelope(down, "openai").headers)


def test_the_anthropic_envelope_gives_its_sdk_an_error_code(store):  # noqa: F811
    plain, _ = blocked(store)
    doc = body(error_envelopes.in_envelope(plain, "anthropic"))
    assert doc["error"]["details"] == {"error_code": "duplicate_unresolved"}  # anthropic's e.error_code
