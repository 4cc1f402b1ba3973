"""
rules/stripe.yaml with the real Stripe SDK (stripe-python's StripeClient, pointed at the proxy
with its `proxy` setting and at the fake with `base_addresses`), through a real mitmdump,
against the fake Stripe of test_stripe.py: it saves each Idempotency-Key's first answer and
returns it to a request with the same key, as Stripe does, and can make an object and then
drop the connection.

The SDK sends an Idempotency-Key of its own with every POST, a new one for each call
(stripe/_api_requestor.py). An agent that calls create again after an unknown outcome sends
a new key: the proxy must send the resend with the key its first attempt went with, or
Stripe makes a second object.
"""

from __future__ import annotations

import uuid
from urllib.parse import parse_qsl

import pytest
import stripe as stripe_sdk

from tests.e2e.packs.harness import PackRun, Seen, State, pack_run
from tests.e2e.packs.test_stripe import CUSTOMERS, SECRET, FakeStripe

API_KEY = SECRET.split()[1]  # the SDK sends "Authorization: Bearer <key>"
# What a call raises when the proxy answers instead of Stripe (502 outcome_unknown, 422 for a
# reused key): the pack says `errors: stripe`, so the SDK reads Stripe's error object and raises a
# StripeError (with the proxy's plain JSON it raised AttributeError: `error` was a string).
SDK_FAILS = (stripe_sdk.StripeError,)


@pytest.fixture(scope="module")
def run(tmp_path_factory, confdir):
    yield from pack_run("stripe.yaml", tmp_path_factory.mktemp("stripe-sdk"), confdir)


@pytest.fixture(scope="module")
def customers(run) -> FakeStripe:
    fake = FakeStripe("cus")
    run.api.on("POST", CUSTOMERS, fake.create)
    run.api.on("GET", CUSTOMERS, fake.listing)
    return fake


@pytest.fixture
def sdk(run, monkeypatch) -> stripe_sdk.StripeClient:
    """
    A StripeClient through the proxy, to the fake over http. max_network_retries=0: each call is
    one request (the SDK's own retries resend with the call's key, which is not this case).
    """
    for name in ("NO_PROXY", "no_proxy"):  # 127.0.0.1 must go through the proxy
        monkeypatch.setenv(name, "")
    return stripe_sdk.StripeClient(
        API_KEY, base_addresses={"api": run.api.origin}, proxy=run.proxy.url, max_network_retries=0
    )


def create_customer(sdk: stripe_sdk.StripeClient, email: str, name: str, key: str | None = None):
    """`customers.create` as an agent calls it (v1 namespace where the SDK has one)."""
    service = getattr(sdk, "v1", sdk).customers
    return service.create(params={"email": email, "name": name}, options={"idempotency_key": key} if key else None)


def creates(run: PackRun, email: str) -> list[Seen]:
    """The customer creates the fake received for this email."""
    return [
        s
        for s in run.api.requests("POST")
        if s.path == CUSTOMERS and dict(parse_qsl(s.body.decode())).get("email") == email
    ]


def events(run: PackRun, operation_id: str) -> list:
    store = run.store()
    try:
        return store.events(operation_id)
    finally:
        store.close()


def dropped_once(run: PackRun, fake: FakeStripe) -> None:
    """The next create is made at Stripe, then its connection drops before the answer."""
    run.api.on("POST", CUSTOMERS, lambda seen: fake.create(seen, then_drop=True), times=1)


def test_a_second_sdk_create_after_an_unknown_outcome_makes_no_second_customer(run, customers, sdk):
    email = f"ada-{uuid.uuid4().hex[:8]}@example.com"
    dropped_once(run, customers)
    with pytest.raises(SDK_FAILS):  # the proxy's 502: outcome unknown
        create_customer(sdk, email, "Ada")
    (made,) = customers.matching(email=email)  # Stripe made it; the answer was lost

    again = create_customer(sdk, email, "Ada")  # a new SDK call: a new Idempotency-Key of its own
    assert again.id == made["id"]  # Stripe's saved answer for the first key
    assert customers.matching(email=email) == [made]  # one customer
    first, second = creates(run, email)
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"]
    # The receipts: the second attempt continues the first (its key dedupes at Stripe, no read).
    store = run.store()
    try:
        (r1,) = [r for r in store.list(limit=None) if r.retry_of is None and r.intent["form"]["email"] == email]
        (r2,) = [r for r in store.list(limit=None) if r.retry_of == r1.operation_id]
    finally:
        store.close()
    assert (r1.state, r2.state, r2.external_id) == (State.SAFE_TO_RETRY, State.SUCCEEDED, made["id"])
    assert "sending again with the same key" in run.history(r1.operation_id)[-1][2]
    assert first.headers["idempotency-key"] == r1.idempotency_key == r2.idempotency_key
    # The SDK sent two keys of its own (two client keys), and neither went upstream.
    assert r1.client_key and r2.client_key and r1.client_key != r2.client_key
    assert again.last_response.headers["x-receipt-idempotency-key"] == r1.idempotency_key
    assert again.last_response.headers["x-receipt-id"] == r2.operation_id


def test_an_agents_keys_still_identify_its_requests_when_the_proxy_sends_its_own(run, customers, sdk):
    """
    draft-ietf-httpapi-idempotency-key-header: a key the agent used for one request, sent with
    another, is answered 422 and not sent, even though the key that went upstream was the proxy's.
    """
    a, b = (f"{n}-{uuid.uuid4().hex[:8]}@example.com" for n in ("grace", "alan"))
    k1, k2 = (f"agent-{n}-{uuid.uuid4().hex[:12]}" for n in ("k1", "k2"))
    dropped_once(run, customers)
    with pytest.raises(SDK_FAILS):
        create_customer(sdk, a, "Grace", k1)
    again = create_customer(sdk, a, "Grace", k2)  # the same customer under the agent's second key
    assert [c["id"] for c in customers.matching(email=a)] == [again.id]
    first = run.receipt(again.last_response.headers["x-receipt-id"]).retry_of
    assert first is not None
    for key in (k1, k2):  # either key, with another customer: refused by the proxy (422), never sent
        with pytest.raises(SDK_FAILS):
            create_customer(sdk, b, "Alan", key)
    second = again.last_response.headers["x-receipt-id"]
    conflicts = [
        e
        for r in (first, second)
        for e in events(run, r)
        if e.event == "blocked" and "Idempotency-Key was used for a different request" in e.reason
    ]
    assert len(conflicts) == 2
    assert creates(run, b) == [] and customers.matching(email=b) == []
    replayed = create_customer(sdk, a, "Grace", k2)  # the first customer, with its own key again
    assert replayed.id == again.id and replayed.last_response.headers["x-receipt-replayed"] == "true"
    sent = {s.headers["idempotency-key"] for s in creates(run, a)}
    assert len(sent) == 1 and not sent & {k1, k2}  # one key upstream, the receipt's, never the agent's
    assert len(customers.matching(email=a)) == 1
