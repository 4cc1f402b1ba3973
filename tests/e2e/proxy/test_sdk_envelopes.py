"""
A blocked duplicate as the real SDKs show it (issue 28 item 5): through a real mitmdump whose rules
name each API's error envelope (tests/rules_envelopes/, `errors:`), against the test upstream. The
first call's connection drops after the upstream committed (the proxy answers 502, outcome unknown);
the identical second call is blocked, and the exception the SDK raises carries the proxy's explanation
and the receipt id.
Before `errors:`, the OpenAI SDK's text was only "Error code: 409" and its `body` the bare string.
An API none of the named envelopes fits takes the rules file's own template (template-like.yaml).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import stripe as stripe_sdk

from proxy_addon.store import Store
from tests.e2e.processes import Proxy

RULES = Path(__file__).parents[2] / "rules_envelopes"
EXPLANATION = "reconcile it before retrying"  # http_answers.HINTS[outcome_unknown]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, confdir):
    p = Proxy(tmp_path_factory.mktemp("envelopes"), confdir, rules=RULES)
    p.start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def through_proxy(proxy, monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, proxy.url)
    for name in ("NO_PROXY", "no_proxy"):  # 127.0.0.1 must go through the proxy
        monkeypatch.setenv(name, "")
    return proxy


def receipt_of(proxy: Proxy, path: str):
    store = Store.open(proxy.db, create=False)
    try:
        (r,) = [r for r in store.list(limit=None) if path in r.target]
        return r
    finally:
        store.close()


def test_openai_sdk_shows_the_explanation_and_the_receipt(through_proxy, upstream, bucket):
    path = f"/api/{bucket}/v1/chat/completions"
    upstream.plan(path, "drop")
    client = openai.OpenAI(base_url=f"{upstream.url}/api/{bucket}/v1", api_key="sk-test-not-a-secret", max_retries=0)

    def ask() -> None:
        client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "write once"}])

    with pytest.raises(openai.InternalServerError):  # 502 outcome_unknown, the proxy's
        ask()
    with pytest.raises(openai.ConflictError) as info:
        ask()

    r = receipt_of(through_proxy, path)
    assert r.state == "outcome_unknown"
    e = info.value
    assert r.operation_id in str(e) and EXPLANATION in str(e)
    assert e.code == "duplicate_unresolved" and e.type == "invalid_request_error"
    assert isinstance(e.body, dict) and e.body["receipt_proxy"]["operation_id"] == r.operation_id
    assert e.body["receipt_proxy"]["state"] == "outcome_unknown"
    assert "sk-test-not-a-secret" not in str(e) and "sk-test-not-a-secret" not in str(e.body)
    assert upstream.commits(path) == 1


def test_an_sdk_with_its_default_retries_hears_the_proxys_own_answer(through_proxy, upstream, bucket):
    """
    The openai SDK retries a 5xx or a 409 twice by default. Its retries of the proxy's 502 (outcome
    unknown) would be blocked 409s, and the agent would hear "duplicate" in place of "outcome unknown";
    the proxy's answer says `x-should-retry: false` where sending again at once cannot help.
    """
    path = f"/api/{bucket}/v1/chat/completions"
    upstream.plan(path, "drop")
    client = openai.OpenAI(base_url=f"{upstream.url}/api/{bucket}/v1", api_key="sk-test-not-a-secret")
    with pytest.raises(openai.InternalServerError) as info:  # before: ConflictError, from its own retry
        client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "write once"}])
    assert info.value.code == "outcome_unknown" and info.value.response.headers["x-should-retry"] == "false"
    r = receipt_of(through_proxy, path)
    store = Store.open(through_proxy.db, create=False)
    try:
        assert [e.reason for e in store.events(r.operation_id) if "duplicate" in (e.reason or "")] == []
    finally:
        store.close()
    assert upstream.commits(path) == 1


def test_anthropic_sdk_shows_the_explanation_and_the_receipt(through_proxy, upstream, bucket):
    path = f"/api/{bucket}/v1/messages"
    upstream.plan(path, "drop")
    client = anthropic.Anthropic(base_url=f"{upstream.url}/api/{bucket}", api_key="sk-ant-not-a-secret", max_retries=0)

    def ask() -> None:
        client.messages.create(model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "write once"}])

    with pytest.raises(anthropic.InternalServerError):
        ask()
    with pytest.raises(anthropic.ConflictError) as info:
        ask()

    r = receipt_of(through_proxy, path)
    e = info.value
    assert r.operation_id in str(e) and EXPLANATION in str(e)
    assert isinstance(e.body, dict) and e.body["error"]["receipt_proxy"]["operation_id"] == r.operation_id
    assert e.error_code == "duplicate_unresolved"  # the SDK reads error.details.error_code
    assert "sk-ant-not-a-secret" not in str(e)
    assert upstream.commits(path) == 1


def test_stripe_sdk_shows_the_explanation_and_the_receipt(proxy, upstream, monkeypatch):
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "")
    client = stripe_sdk.StripeClient(
        "sk_test_not_a_secret", base_addresses={"api": upstream.url}, proxy=proxy.url, max_network_retries=0
    )
    customers = getattr(client, "v1", client).customers
    email = f"{uuid.uuid4().hex[:10]}@example.test"
    upstream.plan("/v1/customers", "drop")
    with pytest.raises(stripe_sdk.StripeError):
        customers.create(params={"email": email})
    with pytest.raises(stripe_sdk.StripeError) as info:
        customers.create(params={"email": email})

    r = receipt_of(proxy, "/v1/customers")
    e = info.value
    assert r.operation_id in str(e) and EXPLANATION in str(e)
    assert e.http_status == 409  # an APIError: stripe-python copies `code` only onto the 400/404 errors
    body = e.json_body
    assert isinstance(body, dict)
    assert body["error"]["code"] == "duplicate_unresolved"
    assert body["error"]["receipt_proxy"]["operation_id"] == r.operation_id
    assert "sk_test_not_a_secret" not in str(e)
    assert upstream.commits("/v1/customers") == 1


def test_a_template_envelope_carries_the_explanation_and_the_receipt(proxy, upstream, bucket):
    """An API none of the named envelopes fits: the rules file's own template, as a client parses it."""
    path = f"/api/{bucket}/v2/tickets"
    upstream.plan(path, "drop")
    secret = "tkt-not-a-secret-7f3a"
    with httpx.Client(proxy=proxy.url, trust_env=False, timeout=30) as client:

        def ask() -> httpx.Response:
            return client.post(
                f"{upstream.url}{path}", json={"subject": "write once"}, headers={"X-Ticket-Token": secret}
            )

        first, second = ask(), ask()

    r = receipt_of(proxy, path)
    assert r.state == "outcome_unknown"
    assert upstream.commits(path) == 1
    assert first.status_code == 502 and second.status_code == 409
    for answer in (first, second):
        doc = answer.json()
        assert list(doc) == ["status", "error", "details"]  # the template's shape, nothing else
        assert doc["status"] == "error"
        assert doc["error"]["http"] == answer.status_code  # a number, as the placeholder's value is
        assert doc["error"]["receipt"] == r.operation_id
        assert doc["error"]["literal"] == "{code}"
        assert doc["details"]["source"] == "receipt-proxy"
        assert doc["details"]["receipt_proxy"]["operation_id"] == r.operation_id
        assert secret not in answer.text
    doc = second.json()
    assert doc["error"]["code"] == "duplicate_unresolved"
    assert r.operation_id in doc["error"]["text"] and EXPLANATION in doc["error"]["text"]
    assert doc["details"]["receipt_proxy"]["state"] == "outcome_unknown"
    assert second.headers["X-Receipt-Id"] == r.operation_id
