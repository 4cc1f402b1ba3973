"""
Fingerprint schemes and earlier versions (fingerprint.py, fingerprint_v1.py, earlier_fingerprints.py).

- `Versions.of`: which earlier versions are computed, and for which receipts.
- The store decides over every fingerprint of an intent (store/attempts.py): an earlier
  scheme's receipt blocks, replays and lends its key; an edited rule's only while unresolved;
  an agent's Idempotency-Key used under an earlier fingerprint is no conflict.

Scheme 1 against commit dc97d6d's own code, in a subprocess: tests/e2e/intent/test_fingerprint_v1.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import json

import pytest

from proxy_addon.intent.earlier_fingerprints import Version, Versions
from proxy_addon.intent.fingerprint import SCHEME, RequestView, build_attempt, fingerprint
from proxy_addon.intent.fingerprint_v1 import fingerprint_v1
from proxy_addon.rules import RuleSet, load_rules
from proxy_addon.states import State
from proxy_addon.store import Held
from proxy_addon.store.versions import INDEXED_SCHEME

KEY = b"0123456789abcdef" * 4


RULES = """\
api: shop
hosts: [api.shop.test, "api.shop.test:8443"]
credentials: {header: api-key}
operations:
  orders.create:
    match: {method: POST, path: "/v1/stores/{store}/orders"}
    fingerprint: {path: [store], body: [order.title, items.0.sku, meta], query: [dry_run], headers: [x-tenant]}
  raw.create:
    match: {method: POST, path: /v1/raw}
  form.create:
    match: {method: POST, path: /v1/form}
    fingerprint: {body: [title, sku]}
"""


JSON = {"content-type": "application/json"}


FORM = {"content-type": "application/x-www-form-urlencoded"}


def view(method, host, port, path, headers, body) -> RequestView:
    return RequestView(method, "https", host, port, path, headers, body)


def match(rules: RuleSet, method, host, port, path, headers, body):
    m = rules.match(host, port, method, path, body, headers=list(headers.items()))
    assert m is not None
    return m


def test_a_gzip_body_is_read_by_scheme_1_as_it_was_sent():
    rules = RuleSet.of([load_rules(RULES, "t.yaml")])
    plain = b'{"order": {"title": "t"}}'
    sent = gzip.compress(plain)
    headers = {**JSON, "content-encoding": "gzip"}
    m = match(rules, "POST", "api.shop.test", 443, "/v1/stores/s1/orders", headers, plain)
    req = dataclasses.replace(view("POST", "api.shop.test", 443, "/v1/stores/s1/orders", headers, plain), sent=sent)
    earlier, _ = build_attempt(m, req, KEY, versions=(Version(1, None, False),)).earlier, None
    v1 = fingerprint_v1(
        m,
        KEY,
        method="POST",
        scheme="https",
        host="api.shop.test",
        port=443,
        path="/v1/stores/s1/orders",
        headers=headers,
        sent=sent,
    )
    assert earlier == (v1,)


def test_the_stores_index_knows_todays_scheme():
    """A new scheme needs a new partial index of earlier schemes (a migration): store/versions.py."""
    assert INDEXED_SCHEME == SCHEME


NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def held(op, state, *, scheme=None, digest=None, rule=None, age=0.0) -> Held:
    last = (NOW - dt.timedelta(seconds=age)).isoformat().replace("+00:00", "Z")
    return Held(op.api, op.name, scheme, digest, rule, State(state), 1, last, "20261201T120000Z-0000000001")


def versions_of(rules: RuleSet, *h: Held) -> Versions:
    return Versions.of(h, rules.operation, now=NOW, replay_window=3600, current=SCHEME)


RULES_AFTER = RULES.replace("body: [title, sku]", "body: [title]").replace(
    "    match: {method: POST, path: /v1/raw}", "    match: {method: POST, path: /v1/raw}\n    after_success: block"
)


@pytest.mark.parametrize(
    "state, age, expected",
    [
        ("outcome_unknown", 10**6, ((1, None, False), (2, None, False))),
        ("submitted", 0, ((1, None, False), (2, None, False))),
        ("succeeded", 60, ((1, None, False), (2, None, False))),
        ("succeeded", 7200, ()),  # past the replay window: nothing to answer with
        ("rejected", 0, ()),
        ("safe_to_retry", 0, ()),  # no idempotency key to lend
    ],
)
def test_receipts_from_before_schemes_are_looked_for_under_schemes_1_and_2(state, age, expected):
    rules = RuleSet.of([load_rules(RULES, "t.yaml")])
    op = rules.operation("shop", "form.create")
    assert op is not None
    got = versions_of(rules, held(op, state, age=age)).of_operation(op)
    assert tuple((v.scheme, v.rule, v.unresolved_only) for v in got) == tuple(
        (s, r, u) for s, r, u in sorted(expected, key=lambda e: -e[0])
    )


def test_after_success_block_looks_for_old_successes_forever():
    rules = RuleSet.of([load_rules(RULES_AFTER, "t.yaml")])
    op = rules.operation("shop", "raw.create")
    assert op is not None
    assert [v.scheme for v in versions_of(rules, held(op, "succeeded", age=10**7)).of_operation(op)] == [2, 1]


def test_an_edited_rule_is_looked_for_only_while_unresolved_and_named():
    before = RuleSet.of([load_rules(RULES, "t.yaml")]).operation("shop", "form.create")
    assert before is not None
    rules = RuleSet.of([load_rules(RULES_AFTER, "t.yaml")])
    op = rules.operation("shop", "form.create")
    assert op is not None
    assert op.rule_digest != before.rule_digest
    old = dict(scheme=SCHEME, digest=before.rule_digest, rule=before.fingerprint_rule())
    unknown = versions_of(rules, held(op, "outcome_unknown", **old))
    assert [(v.scheme, v.rule, v.unresolved_only) for v in unknown.of_operation(op)] == [
        (SCHEME, before.fingerprint_rule(), True)
    ]
    assert len(unknown.warnings()) == 1 and "earlier version of its rule" in unknown.warnings()[0]
    assert versions_of(rules, held(op, "succeeded", **old)).of_operation(op) == ()  # the edit decides: no replay
    assert versions_of(rules, held(op, "outcome_unknown", scheme=SCHEME, digest=op.rule_digest)).of_operation(op) == ()


def test_receipts_the_rules_no_longer_have_are_named():
    rules = RuleSet.of([load_rules(RULES, "t.yaml")])
    gone = Held("shop", "orders.delete", SCHEME, "x", None, State.OUTCOME_UNKNOWN, 3, "2026-12-01T12:00:00Z", "ID9")
    v = versions_of(rules, gone)
    assert v.by_operation == {}
    (line,) = v.warnings()
    assert "shop orders.delete: 3 unresolved receipts (newest ID9)" in line and "no longer have" in line


def test_an_edited_rule_gives_the_request_its_old_fingerprint():
    before = RuleSet.of([load_rules(RULES, "t.yaml")])
    after = RuleSet.of([load_rules(RULES_AFTER, "t.yaml")])
    args = ("POST", "api.shop.test", 443, "/v1/form", FORM, b"title=a&sku=b")
    old = fingerprint(match(before, *args), view(*args), KEY).fingerprint
    m = match(after, *args)
    assert m is not None
    before_op = before.operation("shop", "form.create")
    assert before_op is not None
    a = build_attempt(m, view(*args), KEY, versions=(Version(SCHEME, before_op.fingerprint_rule(), True),))
    assert a.intent_fingerprint != old
    assert (a.earlier, a.earlier_unresolved) == ((), (old,))


def attempt_for(rules: RuleSet, *args, versions=(), client_key=None, idempotency=False):
    a = build_attempt(match(rules, *args), view(*args), KEY, versions=versions)
    return dataclasses.replace(a, client_key=client_key, idempotency=idempotency)


def earlier_receipt(store, a, state: State, *, fingerprint: str):
    """A receipt as an earlier version made it: `fingerprint`, no scheme or rule recorded."""
    old = dataclasses.replace(
        a,
        intent_fingerprint=fingerprint,
        fingerprint_scheme=None,
        fingerprint_rule=None,
        earlier=(),
        earlier_unresolved=(),
    )
    d = store.begin_attempt(old)
    assert d.kind == "forward"
    if state is not State.SUBMITTED:
        store.transition(d.receipt.operation_id, state, reason="before the upgrade")
    return d.receipt


ARGS = (
    "POST",
    "api.shop.test",
    443,
    "/v1/stores/s1/orders",
    {**JSON, "authorization": "Bearer tok"},
    b'{"order": {"title": "t"}}',
)


def v1_of(rules, *args):
    method, host, port, path, headers, body = args
    return fingerprint_v1(
        match(rules, *args),
        KEY,
        method=method,
        scheme="https",
        host=host,
        port=port,
        path=path,
        headers=headers,
        sent=body,
    )


def test_an_unknown_outcome_under_scheme_1_blocks_the_retry(backend_store):
    rules = RuleSet.of([load_rules(RULES, "t.yaml")])
    a = attempt_for(rules, *ARGS, versions=(Version(2, None, False), Version(1, None, False)))
    old = earlier_receipt(backend_store, a, State.OUTCOME_UNKNOWN, fingerprint=v1_of(rules, *ARGS))
    assert old.intent_fingerprint in a.earlier
    d = backend_store.begin_attempt(a)
    assert (d.kind, d.receipt.operation_id) == ("blocked", old.operation_id)
    plain = dataclasses.replace(a, earlier=())  # as before this change: a new write
    assert backend_store.begin_attempt(plain).kind == "forward"


def test_a_retry_of_an_earlier_schemes_safe_to_retry_reuses_its_key(backend_store):
    rules = RuleSet.of([load_rules(RULES, "t.yaml")])
    a = attempt_for(rules, *ARGS, versions=(Version(1, None, False),), idempotency=True)
    old = earlier_receipt(
        backend_store, dataclasses.replace(a, idempotency=True), State.OUTCOME_UNKNOWN, fingerprint=v1_of(rules, *ARGS)
    )
    backend_store.transition(old.operation_id, State.RECONCILING, reason="read")
    backend_store.transition(old.operation_id, State.SAFE_TO_RETRY, reason="absent")
    d = backend_store.begin_attempt(a)
    assert d.kind == "forward"
    assert (d.receipt.retry_of, d.receipt.idempotency_key) == (old.operation_id, old.idempotency_key)
    assert d.receipt.fingerprint_scheme == SCHEME


def test_an_edited_rules_receipt_answers_only_while_unresolved(backend_store):
    before = RuleSet.of([load_rules(RULES, "t.yaml")])
    after = RuleSet.of([load_rules(RULES_AFTER, "t.yaml")])
    args = ("POST", "api.shop.test", 443, "/v1/form", FORM, b"title=a&sku=b")
    old_fp = fingerprint(match(before, *args), view(*args), KEY).fingerprint
    before_op = before.operation("shop", "form.create")
    assert before_op is not None
    rule = before_op.fingerprint_rule()
    a = attempt_for(after, *args, versions=(Version(SCHEME, rule, True),))
    old = earlier_receipt(backend_store, a, State.SUBMITTED, fingerprint=old_fp)
    assert backend_store.begin_attempt(a).kind == "blocked"
    backend_store.transition(old.operation_id, State.SUCCEEDED, reason="HTTP 201")
    d = backend_store.begin_attempt(a)  # a success under the old rule is not this intent's any more
    assert (d.kind, d.receipt.retry_of) == ("forward", None)


def test_the_agents_key_used_under_an_earlier_fingerprint_is_no_conflict(backend_store):
    rules = RuleSet.of([load_rules(RULES, "t.yaml")])
    a = attempt_for(rules, *ARGS, versions=(Version(1, None, False),), client_key="hmac:agent-key")
    old = earlier_receipt(backend_store, a, State.SUCCEEDED, fingerprint=v1_of(rules, *ARGS))
    d = backend_store.begin_attempt(a)
    assert (d.kind, d.receipt.operation_id) != ("key_conflict", old.operation_id)
    assert d.receipt.operation_id == old.operation_id


def test_fingerprint_versions_reads_what_the_store_holds(backend_store):
    rules = RuleSet.of([load_rules(RULES, "t.yaml")])
    op = rules.operation("shop", "orders.create")
    assert op is not None
    backend_store.remember_rules({op.rule_digest: json.dumps(op.fingerprint_rule())})
    backend_store.remember_rules({op.rule_digest: json.dumps(op.fingerprint_rule())})  # once
    a = attempt_for(rules, *ARGS)
    earlier_receipt(backend_store, a, State.OUTCOME_UNKNOWN, fingerprint="sha256:" + "1" * 64)
    today = backend_store.begin_attempt(a)  # a new receipt of today's version: not an earlier one
    assert today.kind == "forward" and today.receipt.fingerprint_rule == op.rule_digest
    rows = {(h.scheme, h.rule_digest, h.state, h.count) for h in backend_store.fingerprint_versions()}
    assert rows == {(None, None, State.OUTCOME_UNKNOWN, 1), (SCHEME, op.rule_digest, State.SUBMITTED, 1)}
    (submitted,) = [h for h in backend_store.fingerprint_versions() if h.scheme == SCHEME]
    assert submitted.rule == op.fingerprint_rule()
