"""Unit tests for proxy_addon.intent.fingerprint: intents, principals, redaction and the HMAC key."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import stat

import pytest

from proxy_addon.errors import RulesError
from proxy_addon.intent import identity
from proxy_addon.intent.body_view import keyed_hash
from proxy_addon.intent.fingerprint import (
    RequestView,
    build_attempt,
    canonical_json,
    dig,
    fingerprint,
    load_or_create_key,
    principal_of,
)
from proxy_addon.rules import RuleSet, load_rules
from proxy_addon.wire.redaction import REDACTED, redact_url

KEY = b"0123456789abcdef" * 4
OTHER_KEY = b"fedcba9876543210" * 4
MARKER = "SeCrEt-MaRkEr-7f3a9c"  # a credential value that must never leak
FP_RE = re.compile(r"^sha256:[0-9a-f]{64}$")

RULES = """\
api: {api}
hosts: [api.shop.test, "api.shop.test:8443", other.shop.test]
credentials: {{header: api-key}}
operations:
  {op}:
    match: {{method: POST, path: "/v1/stores/{{store}}/orders"}}
    fingerprint:
      body: [order.title, items.0.sku]
      query: [dry_run]
      headers: [x-tenant]
  raw:
    match: {{method: POST, path: /v1/raw}}
  ignore-body:
    match: {{method: POST, path: /v1/ping}}
    fingerprint: {{body: []}}
  form:
    match: {{method: POST, path: /v1/form}}
    fingerprint: {{body: [title, sku]}}
"""

_RULESETS: dict[tuple[str, str], RuleSet] = {}


def ruleset(api: str = "shop", op: str = "orders.create") -> RuleSet:
    if (api, op) not in _RULESETS:
        _RULESETS[(api, op)] = RuleSet.of([load_rules(RULES.format(api=api, op=op), "t.yaml")])
    return _RULESETS[(api, op)]


BASE_BODY = {"order": {"title": "Mug", "note": "gift wrap"}, "items": [{"sku": "A1", "qty": 1}]}
BASE_HEADERS = {"content-type": "application/json", "api-key": "key-1", "x-tenant": "t1", "user-agent": "agent/1"}
BASE = dict(
    api="shop",
    op="orders.create",
    method="POST",
    scheme="https",
    host="api.shop.test",
    port=443,
    path="/v1/stores/s1/orders?dry_run=0",
    headers=BASE_HEADERS,
    body=json.dumps(BASE_BODY).encode(),
)


def run(key: bytes = KEY, **overrides):
    """Match the request against the rules (as the addon does) and fingerprint it."""
    r = {**BASE, **overrides}
    m = ruleset(r["api"], r["op"]).match(r["host"], r["port"], r["method"], r["path"])
    assert m is not None, f"test request did not match a rule: {r}"
    view = RequestView(r["method"], r["scheme"], r["host"], r["port"], r["path"], r["headers"], r["body"])
    return fingerprint(m, view, key)


def body_with(**changes) -> bytes:
    doc = json.loads(json.dumps(BASE_BODY))
    for dotted, value in changes.items():
        target = doc
        parts = dotted.split("__")
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        target[parts[-1]] = value
    return json.dumps(doc).encode()


def headers_with(**changes) -> dict[str, str]:
    h = dict(BASE_HEADERS)
    for k, v in changes.items():
        k = k.replace("_", "-")
        if v is None:
            h.pop(k, None)
        else:
            h[k] = v
    return h


# --- stability ------------------------------------------------------------------------------

STABLE_BODIES = [
    pytest.param(json.dumps(BASE_BODY).encode(), id="same-bytes"),
    pytest.param(json.dumps(BASE_BODY, sort_keys=True).encode(), id="sorted-keys"),
    pytest.param(
        json.dumps({"items": [{"qty": 1, "sku": "A1"}], "order": {"note": "gift wrap", "title": "Mug"}}).encode(),
        id="reversed-key-order",
    ),
    pytest.param(json.dumps(BASE_BODY, indent=4).encode(), id="indented"),
    pytest.param(json.dumps(BASE_BODY, separators=(",", ":")).encode(), id="compact"),
    pytest.param(b"\n\t " + json.dumps(BASE_BODY, indent="\t").encode() + b"\r\n  ", id="surrounding-whitespace"),
]


@pytest.mark.parametrize("body", STABLE_BODIES)
def test_same_intent_same_fingerprint_whatever_the_json_layout(body):
    base = run()
    other = run(body=body)
    assert FP_RE.match(other.fingerprint), other.fingerprint
    assert other.fingerprint == base.fingerprint
    assert other.intent == base.intent


def test_fingerprint_format_and_repeatability():
    a, b = run(), run()
    assert FP_RE.match(a.fingerprint)
    assert a == b
    assert a.intent == {
        "path": {"store": "s1"},
        "query": {"dry_run": "0"},
        "headers": {"x-tenant": "t1"},
        "body": {"order.title": "Mug", "items.0.sku": "A1"},
    }


# --- what changes the fingerprint and what does not -----------------------------------------

CHANGES = [
    pytest.param(dict(body=body_with(order__title="Cup")), id="allowlisted-body-field"),
    pytest.param(dict(body=body_with(items__0__sku="B2")), id="allowlisted-list-index-field"),
    pytest.param(dict(path="/v1/stores/s2/orders?dry_run=0"), id="path-param"),
    pytest.param(dict(path="/v1/stores/s1/orders?dry_run=1"), id="allowlisted-query-param"),
    pytest.param(dict(path="/v1/stores/s1/orders"), id="allowlisted-query-param-absent"),
    pytest.param(dict(headers=headers_with(x_tenant="t2")), id="allowlisted-header"),
    pytest.param(dict(headers=headers_with(x_tenant=None)), id="allowlisted-header-absent"),
    pytest.param(dict(api="shop-eu"), id="api"),
    pytest.param(dict(op="orders.place"), id="operation"),
    pytest.param(dict(host="other.shop.test"), id="host"),
    pytest.param(dict(port=8443), id="port"),
    pytest.param(dict(headers=headers_with(api_key="key-2")), id="credential"),
]

NO_CHANGES = [
    pytest.param(dict(body=body_with(order__note="no wrap")), id="other-body-field"),
    pytest.param(dict(body=body_with(items__0__qty=5)), id="other-list-item-field"),
    pytest.param(dict(body=body_with(extra={"a": 1})), id="new-body-field"),
    pytest.param(dict(path="/v1/stores/s1/orders?dry_run=0&utm=1"), id="other-query-param"),
    pytest.param(dict(path="/v1/stores/s1/orders?utm_source=x&dry_run=0"), id="other-query-param-first"),
    pytest.param(dict(headers=headers_with(user_agent="agent/2")), id="other-header"),
    pytest.param(dict(headers=headers_with(x_request_id="r-123")), id="new-header"),
    pytest.param(dict(host="API.Shop.TEST"), id="host-case"),
]


@pytest.mark.parametrize("change", CHANGES)
def test_a_change_in_the_intent_changes_the_fingerprint(change):
    base, other = run(), run(**change)
    assert FP_RE.match(other.fingerprint)
    assert other.fingerprint != base.fingerprint


@pytest.mark.parametrize("change", NO_CHANGES)
def test_a_change_outside_the_allowlist_keeps_the_fingerprint(change):
    base, other = run(), run(**change)
    assert other.fingerprint == base.fingerprint
    assert other.intent == base.intent


def test_trailing_dot_host_is_the_same_intent():
    # RuleSet.match strips a trailing dot, so "api.shop.test." is the same API and operation;
    # the fingerprint must agree, or a duplicate sent via the FQDN form bypasses the block.
    assert run(host="api.shop.test.").fingerprint == run().fingerprint


# --- principal ------------------------------------------------------------------------------

PRINCIPAL_CASES = [
    # id, headers A, headers B, same principal?
    ("authorization-differs", {"authorization": "Bearer A"}, {"authorization": "Bearer B"}, False),
    ("authorization-same", {"authorization": "Bearer A"}, {"authorization": "Bearer A"}, True),
    ("rule-header-differs", {"api-key": "K1"}, {"api-key": "K2"}, False),
    # Every part that can carry a credential counts (scheme 3): Authorization beside the rule's own header too.
    (
        "authorization-counts-beside-the-rule-header",
        {"api-key": "K", "authorization": "Bearer A"},
        {"api-key": "K", "authorization": "Bearer B"},
        False,
    ),
    ("rule-header-wins-over-cookie", {"api-key": "K", "cookie": "s=1"}, {"api-key": "K", "cookie": "s=2"}, True),
    (
        "authorization-wins-over-cookie",
        {"authorization": "Bearer A", "cookie": "s=1"},
        {"authorization": "Bearer A", "cookie": "s=2"},
        True,
    ),
    ("cookie-when-nothing-else", {"cookie": "s=1"}, {"cookie": "s=2"}, False),
    ("cookie-same", {"cookie": "s=1"}, {"cookie": "s=1"}, True),
    ("same-value-other-header", {"api-key": "V"}, {"authorization": "V"}, False),
    ("empty-rule-header-falls-back", {"api-key": "", "authorization": "Bearer A"}, {"authorization": "Bearer A"}, True),
    ("anonymous-vs-credential", {}, {"authorization": "Bearer A"}, False),
]


@pytest.mark.parametrize("a, b, same", [pytest.param(a, b, s, id=i) for i, a, b, s in PRINCIPAL_CASES])
def test_principal_follows_the_credential(a, b, same):
    base = {"content-type": "application/json", "x-tenant": "t1"}
    ia, ib = run(headers={**base, **a}), run(headers={**base, **b})
    assert (ia.principal == ib.principal) is same
    assert (ia.fingerprint == ib.fingerprint) is same
    for i in (ia, ib):
        assert i.principal == "anonymous" or re.fullmatch(r"hmac:[0-9a-f]{32}", i.principal), i.principal


ACCOUNT_RULES = """\
api: pay
hosts: [api.pay.test]
credentials: {header: [Authorization, Stripe-Account]}
operations:
  charges.create:
    match: {method: POST, path: /v1/charges}
"""

ACCOUNT_CASES = [
    # id, headers A, headers B, same principal?
    (
        "two-accounts-one-key",
        {"authorization": "Bearer A", "stripe-account": "acct_1"},
        {"authorization": "Bearer A", "stripe-account": "acct_2"},
        False,
    ),
    (
        "one-account-twice",
        {"authorization": "Bearer A", "stripe-account": "acct_1"},
        {"authorization": "Bearer A", "stripe-account": "acct_1"},
        True,
    ),
    (
        "account-vs-none",
        {"authorization": "Bearer A", "stripe-account": "acct_1"},
        {"authorization": "Bearer A"},
        False,
    ),
    (
        "two-keys-one-account",
        {"authorization": "Bearer A", "stripe-account": "acct_1"},
        {"authorization": "Bearer B", "stripe-account": "acct_1"},
        False,
    ),
    (
        "each-value-canonical",
        {"authorization": "Bearer A", "stripe-account": "acct_1"},
        {"authorization": "bearer  A", "stripe-account": " acct_1 "},
        True,
    ),
    (
        "empty-account-is-absent",
        {"authorization": "Bearer A", "stripe-account": ""},
        {"authorization": "Bearer A"},
        True,
    ),
]


@pytest.mark.parametrize("a, b, same", [pytest.param(a, b, s, id=i) for i, a, b, s in ACCOUNT_CASES])
def test_every_credential_header_of_the_rule_enters_the_principal(a, b, same):
    m = RuleSet.of([load_rules(ACCOUNT_RULES, "pay.yaml")]).match("api.pay.test", 443, "POST", "/v1/charges")
    assert m is not None
    assert (principal_of(m, a, KEY) == principal_of(m, b, KEY)) is same


def test_a_lone_credential_header_hashes_as_before():
    # Receipts recorded before account headers counted keep their principal: one header alone
    # is hashed as (name, value), as it always was.
    m = RuleSet.of([load_rules(ACCOUNT_RULES, "pay.yaml")]).match("api.pay.test", 443, "POST", "/v1/charges")
    assert m is not None
    assert principal_of(m, {"authorization": "Bearer A"}, KEY) == keyed_hash(KEY, "authorization", "bearer A")


@pytest.mark.parametrize(
    "headers, expected",
    [
        pytest.param({}, "anonymous", id="no-headers"),
        pytest.param({"user-agent": "x", "x-tenant": "t"}, "anonymous", id="no-credential"),
        pytest.param({"authorization": ""}, "anonymous", id="empty-authorization"),
        pytest.param({"authorization": "Bearer A"}, "hmac", id="authorization"),
        pytest.param({"cookie": "s=1"}, "hmac", id="cookie"),
        pytest.param({"api-key": "K"}, "hmac", id="rule-header"),
    ],
)
def test_principal_of_kind(headers, expected):
    m = ruleset().match("api.shop.test", 443, "POST", "/v1/raw")
    assert m is not None
    assert principal_of(m, headers, KEY).split(":")[0] == expected


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"api-key": "K"}, id="rule-header"),
        pytest.param({"authorization": "Bearer A"}, id="authorization"),
        pytest.param({"cookie": "s=1"}, id="cookie"),
    ],
)
def test_a_different_hmac_key_gives_a_different_principal(headers):
    h = {**headers, "x-tenant": "t1"}
    a, b = run(headers=h, key=KEY), run(headers=h, key=OTHER_KEY)
    assert a.principal != b.principal
    assert a.fingerprint != b.fingerprint
    assert a.intent == b.intent


LEAK_CASES = [
    pytest.param(dict(headers=headers_with(api_key=MARKER)), id="rule-header"),
    pytest.param(dict(headers=headers_with(api_key=None, authorization=f"Bearer {MARKER}")), id="authorization"),
    pytest.param(dict(headers=headers_with(api_key=None, cookie=f"session={MARKER}")), id="cookie"),
    pytest.param(dict(headers={**BASE_HEADERS, "proxy-authorization": f"Basic {MARKER}"}), id="proxy-authorization"),
    pytest.param(dict(path=f"/v1/stores/s1/orders?dry_run=0&api_key={MARKER}"), id="query-api_key"),
    pytest.param(dict(path=f"/v1/stores/s1/orders?access_token={MARKER}&dry_run=0"), id="query-access_token"),
    pytest.param(dict(path=f"/v1/stores/s1/orders?dry_run=0&sig={MARKER}"), id="query-sig"),
]


@pytest.mark.parametrize("change", LEAK_CASES)
def test_the_credential_value_never_appears_in_the_intent(change):
    result = run(**change)
    assert MARKER not in json.dumps(result.intent)
    assert MARKER not in result.principal
    assert MARKER not in result.target
    assert MARKER not in canonical_json(dataclasses.asdict(result))


def test_a_credential_looking_body_field_never_enters_the_intent():
    text = """\
api: login
hosts: [auth.shop.test]
operations:
  sessions.create:
    match: {method: POST, path: /v1/sessions}
    fingerprint: {body: [user.name, user.password]}
"""
    try:
        rf = load_rules(text, "t.yaml")
    except RulesError:
        return  # refusing the rule is an acceptable fix
    m = RuleSet.of([rf]).match("auth.shop.test", 443, "POST", "/v1/sessions")
    assert m is not None
    body = json.dumps({"user": {"name": "ann", "password": MARKER}}).encode()
    view = RequestView(
        "POST", "https", "auth.shop.test", 443, "/v1/sessions", {"content-type": "application/json"}, body
    )
    assert MARKER not in canonical_json(dataclasses.asdict(fingerprint(m, view, KEY)))


# --- bodies -----------------------------------------------------------------------------------

JSON_CT = {"content-type": "application/json"}
FORM_CT = {"content-type": "application/x-www-form-urlencoded"}
FORM_CT_CHARSET = {"content-type": "Application/X-WWW-Form-Urlencoded; charset=utf-8"}
ORDERS = "/v1/stores/s1/orders"


def sha(b: bytes) -> dict:
    return {"body_sha256": hashlib.sha256(b).hexdigest()}


class _KeyedHash:
    """Equal to any keyed hash (`hmac:` and 32 hex digits): what an object a rule names is stored as."""

    def __eq__(self, other):
        return isinstance(other, str) and re.fullmatch(r"hmac:[0-9a-f]{32}", other) is not None

    def __repr__(self):
        return "hmac:<32 hex>"


A_KEYED_HASH = _KeyedHash()

BODY_CASES = [
    # id, path, headers, body, expected body part of the intent
    (
        "json-fields",
        ORDERS,
        JSON_CT,
        b'{"order": {"title": "Mug"}, "items": [{"sku": "A1"}]}',
        {"body": {"order.title": "Mug", "items.0.sku": "A1"}},
    ),
    (
        "json-missing-field",
        ORDERS,
        JSON_CT,
        b'{"order": {"title": "Mug"}}',
        {"body": {"order.title": "Mug", "items.0.sku": None}},
    ),
    (
        "json-index-out-of-range",
        ORDERS,
        JSON_CT,
        b'{"order": {"title": "Mug"}, "items": []}',
        {"body": {"order.title": "Mug", "items.0.sku": None}},
    ),
    (
        "json-nested-value",
        ORDERS,
        JSON_CT,
        b'{"order": {"title": {"en": "Mug"}}}',
        {"body": {"order.title": A_KEYED_HASH, "items.0.sku": None}},
    ),  # an object: its hash, never its leaves
    (
        "json-without-content-type",
        ORDERS,
        {},
        b'{"order": {"title": "Mug"}}',
        {"body": {"order.title": "Mug", "items.0.sku": None}},
    ),
    (
        "json-unicode",
        ORDERS,
        JSON_CT,
        '{"order": {"title": "Tasse \u00e0 caf\u00e9"}}'.encode(),
        {"body": {"order.title": "Tasse \u00e0 caf\u00e9", "items.0.sku": None}},
    ),
    ("form-fields", "/v1/form", FORM_CT, b"title=Mug&sku=A1&note=gift", {"form": {"title": "Mug", "sku": "A1"}}),
    (
        "form-charset-param",
        "/v1/form",
        FORM_CT_CHARSET,
        b"sku=A1&title=Big+Mug",
        {"form": {"title": "Big Mug", "sku": "A1"}},
    ),
    ("form-missing-field", "/v1/form", FORM_CT, b"title=Mug", {"form": {"title": "Mug", "sku": None}}),
    (
        "form-repeated-field",
        "/v1/form",
        FORM_CT,
        b"title=Mug&sku=A1&sku=B2",
        {"form": {"title": "Mug", "sku": ["A1", "B2"]}},
    ),
    (
        "form-dotted-names-literal",
        ORDERS,
        FORM_CT,
        b"order.title=Mug&items.0.sku=A1",
        {"form": {"order.title": "Mug", "items.0.sku": "A1"}},
    ),
    (
        "non-json-bytes",
        ORDERS,
        {"content-type": "application/octet-stream"},
        b"\xff\xfe binary",
        sha(b"\xff\xfe binary"),
    ),
    ("invalid-json", ORDERS, JSON_CT, b'{"order": {"title": "Mug"', sha(b'{"order": {"title": "Mug"')),
    ("invalid-form", "/v1/form", FORM_CT, b"\xff\xfe=1", sha(b"\xff\xfe=1")),
    ("no-body-rule-json", "/v1/raw", JSON_CT, b'{"a": 1}', sha(b'{"a": 1}')),
    ("no-body-rule-binary", "/v1/raw", {}, b"\x00\x01\x02", sha(b"\x00\x01\x02")),
    ("no-body-rule-empty", "/v1/raw", {}, b"", sha(b"")),
    ("body-empty-list-rule", "/v1/ping", JSON_CT, b'{"a": 1}', {}),
    ("body-empty-list-rule-binary", "/v1/ping", {}, b"\xff\xfe binary", {}),
    ("empty-body-json-rule", ORDERS, JSON_CT, b"", sha(b"")),
    ("empty-body-form-rule", "/v1/form", FORM_CT, b"", sha(b"")),
]


@pytest.mark.parametrize("path, headers, body, expected", [pytest.param(*c[1:], id=c[0]) for c in BODY_CASES])
def test_body_view(path, headers, body, expected):
    result = run(path=path, headers=headers, body=body)
    assert FP_RE.match(result.fingerprint)
    got = {k: v for k, v in result.intent.items() if k in ("body", "form", "body_sha256")}
    assert got == expected


@pytest.mark.parametrize(
    "path, body_a, body_b, same",
    [
        pytest.param("/v1/ping", b'{"a": 1}', b'{"a": 2}', True, id="ignored-body"),
        pytest.param("/v1/raw", b'{"a": 1}', b'{"a": 1} ', False, id="whole-body-hash-is-bytewise"),
        pytest.param("/v1/raw", b"\xff\xfe binary", b"\xff\xfe binarY", False, id="binary-differs"),
        pytest.param(ORDERS, b"\xff\xfe binary", b"\xff\xfe binary", True, id="binary-same"),
    ],
)
def test_body_hash_and_ignored_body_fingerprints(path, body_a, body_b, same):
    a, b = run(path=path, headers={}, body=body_a), run(path=path, headers={}, body=body_b)
    assert (a.fingerprint == b.fingerprint) is same


@pytest.mark.parametrize(
    "doc, dotted, expected",
    [
        pytest.param({"a": {"b": 1}}, "a.b", 1, id="nested"),
        pytest.param({"a": [{"b": 2}, {"b": 3}]}, "a.1.b", 3, id="list-index"),
        pytest.param({"a": [1]}, "a.5", None, id="index-out-of-range"),
        pytest.param({"a": [1]}, "a.-1", None, id="negative-index"),
        pytest.param({"a": [1]}, "a.x", None, id="non-numeric-index"),
        pytest.param({"a": {"0": "zero"}}, "a.0", "zero", id="digit-key-in-dict"),
        pytest.param({"a": 1}, "a.b", None, id="through-a-scalar"),
        pytest.param({"a": 1}, "b", None, id="missing"),
        pytest.param({"a": None}, "a", None, id="null"),
        pytest.param({"a": False}, "a", False, id="false-is-kept"),
        pytest.param([{"id": 9}], "0.id", 9, id="top-level-list"),
        pytest.param("text", "a", None, id="top-level-scalar"),
    ],
)
def test_dig(doc, dotted, expected):
    assert dig(doc, dotted) == expected


@pytest.mark.parametrize(
    "value, expected",
    [
        pytest.param({"b": 1, "a": [2, {"d": 3, "c": 4}]}, '{"a":[2,{"c":4,"d":3}],"b":1}', id="sorted-compact"),
        pytest.param({"t": "caf\u00e9"}, '{"t":"caf\u00e9"}', id="not-ascii-escaped"),
    ],
)
def test_canonical_json(value, expected):
    assert canonical_json(value) == expected


# --- redact_url -------------------------------------------------------------------------------

SECRET_PARAMS = [
    "token",
    "access_token",
    "api_key",
    "apikey",
    "key",
    "secret",
    "password",
    "sig",
    "signature",
    "session",
    "API_KEY",
    "X-Amz-Signature",
    "client_secret",
]


@pytest.mark.parametrize("name", SECRET_PARAMS)
def test_redact_url_secret_query_values(name):
    # Even a rule that names it (the loader refuses that) keeps a credential-looking value redacted.
    got = redact_url("https", "api.test", 443, f"/x?page=2&{name}=s3cr3t&q=mugs", keep=("page", "q", name))
    assert got == f"https://api.test/x?page=2&{name}={REDACTED}&q=mugs"
    assert "s3cr3t" not in got


@pytest.mark.parametrize("name", ["jwt", "access_key", "pass", "private_key", "x_thing", "page"])
def test_redact_url_redacts_every_value_the_rule_does_not_name(name):
    """Deny by default: names on no list (`jwt`, `x_thing`) are redacted as surely as `token`."""
    got = redact_url("https", "api.test", 443, f"/x?{name}=s3cr3t&q=mugs&bare", keep=("q",))
    assert got == f"https://api.test/x?{name}={REDACTED}&q=mugs&{REDACTED}"


# The names "the rule" names: kept, but a credential-looking one (token, key, api_key) stays redacted.
KEPT = ("q", "page", "keyword", "q_x", "a", "token", "key", "api_key")

REDACT_CASES = [
    # id, scheme, host, port, path, expected
    ("kept-params", "https", "api.test", 443, "/search?q=mugs&page=3", "https://api.test/search?q=mugs&page=3"),
    ("unnamed-params", "https", "api.test", 443, "/search?c=mugs&d=3", "https://api.test/search?c=REDACTED&d=REDACTED"),
    ("no-query", "https", "api.test", 443, "/v1/items", "https://api.test/v1/items"),
    ("blank-secret", "https", "api.test", 443, "/x?token=&page=1", "https://api.test/x?token=REDACTED&page=1"),
    ("repeated-secret", "https", "api.test", 443, "/x?key=a&key=b", "https://api.test/x?key=REDACTED&key=REDACTED"),
    ("encoded-secret-name", "https", "api.test", 443, "/x?api%5Fkey=zz", "https://api.test/x?api%5Fkey=REDACTED"),
    ("keyword-is-not-key", "https", "api.test", 443, "/x?keyword=mugs", "https://api.test/x?keyword=mugs"),
    ("encoded-kept-name", "https", "api.test", 443, "/x?q%5Fx=1", "https://api.test/x?q%5Fx=1"),
    ("fragment-dropped", "https", "api.test", 443, "/x?q=1#page=2", "https://api.test/x?q=1"),
    ("encoded-value-kept", "https", "api.test", 443, "/x?q=a%20b", "https://api.test/x?q=a%20b"),
    ("http-80-omitted", "http", "api.test", 80, "/x", "http://api.test/x"),
    ("https-443-omitted", "https", "api.test", 443, "/x", "https://api.test/x"),
    ("http-8080-kept", "http", "api.test", 8080, "/x", "http://api.test:8080/x"),
    ("https-8443-kept", "https", "api.test", 8443, "/x", "https://api.test:8443/x"),
    ("https-on-80-kept", "https", "api.test", 80, "/x", "https://api.test:80/x"),
    ("http-on-443-kept", "http", "api.test", 443, "/x", "http://api.test:443/x"),
]


@pytest.mark.parametrize("scheme, host, port, path, expected", [pytest.param(*c[1:], id=c[0]) for c in REDACT_CASES])
def test_redact_url(scheme, host, port, path, expected):
    assert redact_url(scheme, host, port, path, keep=KEPT) == expected


@pytest.mark.parametrize(
    "scheme, host, port, path, expected",
    [
        pytest.param(
            "https",
            "api.test",
            443,
            "//v1/items?token=s",
            "https://api.test//v1/items?token=REDACTED",
            id="double-slash-path",
        ),
        pytest.param(
            "http",
            "::1",
            8080,
            "/x?a=1",
            "http://[::1]:8080/x?a=1",
            id="ipv6-host",
        ),
    ],
)
def test_redact_url_keeps_the_url_valid(scheme, host, port, path, expected):
    assert redact_url(scheme, host, port, path, keep=KEPT) == expected


# --- the HMAC key ----------------------------------------------------------------------------


def test_load_or_create_key_creates_a_private_key(tmp_path):
    path = tmp_path / "state" / "hmac.key"
    key = load_or_create_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert re.fullmatch(rb"[0-9a-f]{64}", key), key
    assert path.read_bytes().strip() == key


def test_load_or_create_key_is_stable(tmp_path):
    path = tmp_path / "hmac.key"
    first = load_or_create_key(path)
    assert load_or_create_key(path) == first
    assert load_or_create_key(str(path)) == first
    assert load_or_create_key(tmp_path / "other.key") != first  # a fresh random key elsewhere


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\n", id="newline-only"),
        pytest.param(b"abc\n", id="short"),
        pytest.param(b"a" * 31, id="31-bytes"),
        pytest.param(b"   " + b"a" * 20 + b"     \n", id="short-padded-with-whitespace"),
    ],
)
def test_load_or_create_key_refuses_a_short_key(tmp_path, content):
    path = tmp_path / "hmac.key"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="shorter than 32 bytes"):
        load_or_create_key(path)
    assert path.read_bytes() == content  # never silently replaced


def test_load_or_create_key_reads_an_existing_key(tmp_path):
    path = tmp_path / "hmac.key"
    path.write_bytes(b"f" * 64 + b"\n")
    assert load_or_create_key(path) == b"f" * 64


@pytest.mark.parametrize("body", [b"1", b"2", b'"a string"', b"[1, 2]", b"null"], ids=str)
def test_json_that_is_not_an_object_is_hashed_whole(body):
    """A bare number, string or list has no fields: two different ones must not look alike."""
    got = run(body=body)
    assert got.intent["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert "body" not in got.intent
    assert run(body=b"3").fingerprint != got.fingerprint


BODY_KEY_RULES = """\
api: batches
hosts: [api.batch.test]
operations:
  batches.create:
    match: {method: POST, path: /v1/batches}
    fingerprint: {body: [input_file_id]}
    idempotency_key: {body: metadata.receipt_key}
  batches.form:
    match: {method: POST, path: /v1/form}
    fingerprint: {body: [input_file_id]}
    idempotency_key: {body: metadata.receipt_key}
"""


@pytest.mark.parametrize(
    "path, content_type, body, given, room",
    [
        ("/v1/batches", "application/json", {"input_file_id": "f1"}, None, True),
        (
            "/v1/batches",
            "application/json",
            {"input_file_id": "f1", "metadata": {"receipt_key": "own-1"}},
            "own-1",
            True,
        ),
        ("/v1/batches", "application/json", {"input_file_id": "f1", "metadata": {"receipt_key": 7}}, "7", True),
        ("/v1/batches", "application/json", {"input_file_id": "f1", "metadata": None}, None, True),
        ("/v1/batches", "application/json", {"input_file_id": "f1", "metadata": "text"}, None, False),
        ("/v1/batches", "application/json", {"input_file_id": "f1", "metadata": {"receipt_key": None}}, None, True),
        ("/v1/batches", "application/json", [1, 2], None, False),
        ("/v1/form", "application/x-www-form-urlencoded", {"input_file_id": "f1"}, None, True),  # curl -d
    ],
)
def test_a_body_is_parsed_once_for_the_fingerprint_and_its_key(monkeypatch, path, content_type, body, given, room):
    """
    The fingerprint's fields and the proxy's key in the body (`idempotency_key: {body: ...}`) read
    one parse of the body (fingerprint.parse_once): the same key and room as reading it apart, once.
    """
    raw = json.dumps(body).encode()
    op_name = "batches.form" if path == "/v1/form" else "batches.create"
    m = RuleSet.of([load_rules(BODY_KEY_RULES, "b.yaml")]).match("api.batch.test", 443, "POST", path)
    assert m is not None and m.operation.name == op_name
    req = RequestView("POST", "https", "api.batch.test", 443, path, {"content-type": content_type}, raw)
    assert identity.body_key(m.operation, raw) == (given, room)  # reading it apart says the same
    parses: list[str] = []
    decode = json.JSONDecoder.decode  # what json.loads and the proxy's own decoders (json_body.py) call

    def counted(self, s, *a, **k):
        parses.append(s)
        return decode(self, s, *a, **k)

    monkeypatch.setattr(json.JSONDecoder, "decode", counted)
    attempt = build_attempt(m, req, KEY)
    assert (attempt.given_key, attempt.idempotency) == (given, room)
    assert parses.count(raw.decode()) == 1  # before: parsed for the fingerprint, for the agent's key, and for the room
    assert attempt.intent_fingerprint == fingerprint(m, dataclasses.replace(req), KEY).fingerprint
