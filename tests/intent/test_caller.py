"""
Every credential enters the principal (proxy_addon/intent/caller.py, fingerprint scheme 3), without a
proxy: which parts of a request count, what the rules may declare, how path credentials are
redacted and hashed, and that scheme 2 still gives every request the fingerprint it gave before.
Through a real proxy: tests/e2e/proxy/test_other_callers.py.
"""

from __future__ import annotations

import json

import pytest

from proxy_addon.errors import RulesError
from proxy_addon.intent.caller import caller_of
from proxy_addon.intent.earlier_fingerprints import Version
from proxy_addon.intent.fingerprint import RequestView, build_attempt, fingerprint
from proxy_addon.rules import RuleSet, check_rules, load_rules
from proxy_addon.states import State
from proxy_addon.store import RecordedResponse, open_store
from proxy_addon.wire.redaction import REDACTED, redact_url, token_shaped
from tests.conftest import FakeClock

KEY = b"0123456789abcdef" * 4
TG = "123456789:AAHfiqksKZ8WmR2zSjiQ7_v4TMAKdiHm9T0"  # a Telegram bot token's shape
GHP = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
FORM = {"content-type": "application/x-www-form-urlencoded"}
JSON = {"content-type": "application/json"}

# Rules in the syntax of the version before this change: scheme 2 must read them as it did.
PIN_RULES = """\
api: pin
hosts: [api.pin.test]
credentials: {header: api-key}
operations:
  token.create:
    match: {method: POST, path: /oauth/token}
    fingerprint: {body: [grant_type, client_id]}
  bot.send:
    match: {method: POST, path: "/bot{token}/sendMessage"}
    fingerprint: {body: [chat_id, text]}
  hook.post:
    match: {method: POST, path: "/api/webhooks/{id}/{webhook_token}"}
    fingerprint: {body: [content]}
  slack.hook:
    match: {method: POST, path: "/services/{team}/{bot}/{secret}"}
  things.create:
    match: {method: POST, path: /v1/things}
    fingerprint: {body: [title]}
"""
PIN = RuleSet.of([load_rules(PIN_RULES, "pin.yaml")])

# id, path, headers, body, what scheme 3 counts in the principal
CORPUS = [
    ("query-api_key", "/v1/things?api_key=K1", JSON, b'{"title": "t"}', ("query:api_key",)),
    ("unnamed-header", "/v1/things", {**JSON, "x-api-key": "K1"}, b'{"title": "t"}', ("x-api-key",)),
    (
        "rule-header-and-authorization",
        "/v1/things",
        {**JSON, "api-key": "A", "authorization": "Bearer B"},
        b'{"title": "t"}',
        ("api-key", "authorization"),
    ),
    (
        "form-client_secret",
        "/oauth/token",
        FORM,
        b"grant_type=client_credentials&client_id=c1&client_secret=S1",
        ("body:client_secret",),
    ),
    (
        "json-client_secret",
        "/oauth/token",
        JSON,
        b'{"grant_type": "client_credentials", "client_id": "c1", "client_secret": "S1"}',
        ("body:client_secret",),
    ),
    ("telegram-path", f"/bot{TG}/sendMessage", JSON, b'{"chat_id": 42, "text": "hi"}', ("path:token",)),
    (
        "discord-path",
        "/api/webhooks/123456/tok-EN_abcdefghijklmnopqrstuvwxyz0123456789",
        JSON,
        b'{"content": "hi"}',
        ("path:webhook_token",),
    ),
    ("slack-webhook-path", "/services/T0001/B0002/XXXXXXXXXXXXXXXXXXXXXXXX", JSON, b'{"text": "hi"}', ("path:secret",)),
    ("body-token-shape", "/v1/things", JSON, b'{"title": "t", "gh": "%s"}' % GHP.encode(), ("body:gh",)),
    ("cookie-only", "/v1/things", {**JSON, "cookie": "s=1"}, b'{"title": "t"}', ("cookie",)),
    ("query-sig-only", "/v1/things?sig=abc", JSON, b'{"title": "t"}', ()),
    ("header-shape", "/v1/things", {**JSON, "x-custom": "sk_live_abcdefghijklmnop"}, b'{"title": "t"}', ("x-custom",)),
    (
        "rule-header-and-query-key",
        "/v1/things?access_token=Q1",
        {**JSON, "api-key": "A"},
        b'{"title": "t"}',
        ("api-key", "query:access_token"),
    ),
]

# What the code before this change computed (it knew no schemes: today's scheme 2), for CORPUS.
SCHEME_2 = {
    "query-api_key": ("sha256:d0b9640fe0b8775f8001eeeb02f174eb9180bed14b78e70da1e223b382a94110", "anonymous"),
    "unnamed-header": ("sha256:d0b9640fe0b8775f8001eeeb02f174eb9180bed14b78e70da1e223b382a94110", "anonymous"),
    "rule-header-and-authorization": (
        "sha256:d4b438dfc0fe12618d307d05d19be2c9c7a48ffe6cc52500734aba6b60e64b35",
        "hmac:db4f4bfc60f1ed0b3858349091f124a2",
    ),
    "form-client_secret": ("sha256:44e24e5e83f82c504197ace498bf3498fde1af33bbdc10a1d593e6a69734fb7d", "anonymous"),
    "json-client_secret": ("sha256:86e842a526c3ab7ab89cebaba703fc1fd3e663b5ad1892003da1d26eb8da9679", "anonymous"),
    "telegram-path": ("sha256:39dd86fcbaa53f37678e1e9a2433f4b86f6547e401a3aec1af4e7e41a80530ad", "anonymous"),
    "discord-path": ("sha256:f27d69fe0797b9b1a231c1d685db7907402eef6acefb5a7a371ed5e7ad9e9286", "anonymous"),
    "slack-webhook-path": ("sha256:b48bc64412491327f5446c4bc1c90c752a0ecafddad33902f959378407d85c22", "anonymous"),
    "body-token-shape": ("sha256:d0b9640fe0b8775f8001eeeb02f174eb9180bed14b78e70da1e223b382a94110", "anonymous"),
    "cookie-only": (
        "sha256:4700adae031f80f2e07a03cb6b3ca0db9d1e7271f53c38971f51063f0741bd6e",
        "hmac:d2bdf7f7ffdda4cd37116807342f1f13",
    ),
    "query-sig-only": ("sha256:d0b9640fe0b8775f8001eeeb02f174eb9180bed14b78e70da1e223b382a94110", "anonymous"),
    "header-shape": ("sha256:d0b9640fe0b8775f8001eeeb02f174eb9180bed14b78e70da1e223b382a94110", "anonymous"),
    "rule-header-and-query-key": (
        "sha256:d4b438dfc0fe12618d307d05d19be2c9c7a48ffe6cc52500734aba6b60e64b35",
        "hmac:db4f4bfc60f1ed0b3858349091f124a2",
    ),
}
# Operation.rule_digest of PIN_RULES before this change: a rule that declares no new place keeps it.
PIN_DIGESTS = {
    "token.create": "aab7c7d28ce8567f",
    "bot.send": "d69c3d5040e3a520",
    "hook.post": "10548abd3713b9f6",
    "slack.hook": "0ae13e4e3cc3778d",
    "things.create": "fd7cb43d57806fde",
}


def view(path: str, headers: dict[str, str], body: bytes, host: str = "api.pin.test") -> RequestView:
    return RequestView("POST", "https", host, 443, path, headers, body)


def pin(path: str, headers: dict[str, str], body: bytes, **kw):
    m = PIN.match("api.pin.test", 443, "POST", path)
    assert m is not None, path
    return fingerprint(m, view(path, headers, body), KEY, **kw)


# --- fingerprint schemes -----------------------------------------------------------------------


@pytest.mark.parametrize("name, path, headers, body", [pytest.param(*c[:4], id=c[0]) for c in CORPUS])
def test_scheme_2_gives_every_request_the_fingerprint_and_principal_it_had(name, path, headers, body):
    got = pin(path, headers, body, scheme=2)
    assert (got.fingerprint, got.principal) == SCHEME_2[name]


@pytest.mark.parametrize("name, path, headers, body, counted", [pytest.param(*c, id=c[0]) for c in CORPUS])
def test_scheme_3_counts_the_credentials_scheme_2_did_not_see(name, path, headers, body, counted):
    got = pin(path, headers, body)
    assert got.counted == counted
    if name == "cookie-only":  # nothing new to count: the principal it always had
        assert (got.fingerprint, got.principal) == SCHEME_2[name]
    else:
        assert got.principal != SCHEME_2[name][1]
        assert got.fingerprint != SCHEME_2[name][0]


def test_a_rule_that_declares_no_new_place_keeps_its_digest():
    assert {op.name: op.rule_digest for op in PIN.operations} == PIN_DIGESTS
    assert all("credential_query" not in op.fingerprint_rule() for op in PIN.operations)


# --- what counts -------------------------------------------------------------------------------

# id, request A, request B (path, headers, body) that differ only by a credential: two callers
TWO_CALLERS = [
    (
        "query-key",
        ("/v1/things?api_key=K1", JSON, b'{"title": "t"}'),
        ("/v1/things?api_key=K2", JSON, b'{"title": "t"}'),
    ),
    (
        "query-key-repeated",
        ("/v1/things?key=K1&key=K2", JSON, b'{"title": "t"}'),
        ("/v1/things?key=K1&key=K3", JSON, b'{"title": "t"}'),
    ),
    (
        "unnamed-header",
        ("/v1/things", {**JSON, "x-api-key": "K1"}, b'{"title": "t"}'),
        ("/v1/things", {**JSON, "x-api-key": "K2"}, b'{"title": "t"}'),
    ),
    (
        "x-auth-token",
        ("/v1/things", {**JSON, "x-auth-token": "K1"}, b'{"title": "t"}'),
        ("/v1/things", {**JSON, "x-auth-token": "K2"}, b'{"title": "t"}'),
    ),
    (
        "authorization-beside-rule-header",
        ("/v1/things", {**JSON, "api-key": "A", "authorization": "Bearer 1"}, b"{}"),
        ("/v1/things", {**JSON, "api-key": "A", "authorization": "Bearer 2"}, b"{}"),
    ),
    (
        "form-client_secret",
        ("/oauth/token", FORM, b"grant_type=g&client_id=c&client_secret=right"),
        ("/oauth/token", FORM, b"grant_type=g&client_id=c&client_secret=wrong"),
    ),
    (
        "json-client_secret",
        ("/oauth/token", JSON, b'{"grant_type": "g", "client_id": "c", "client_secret": "right"}'),
        ("/oauth/token", JSON, b'{"grant_type": "g", "client_id": "c", "client_secret": "wrong"}'),
    ),
    (
        "json-sent-as-form",
        ("/oauth/token", FORM, b'{"grant_type": "g", "client_id": "c", "password": "p1"}'),
        ("/oauth/token", FORM, b'{"grant_type": "g", "client_id": "c", "password": "p2"}'),
    ),
    (
        "multipart-token",
        (
            "/v1/things",
            {"content-type": "multipart/form-data; boundary=b"},
            b'--b\r\nContent-Disposition: form-data; name="token"\r\n\r\nT1\r\n--b--\r\n',
        ),
        (
            "/v1/things",
            {"content-type": "multipart/form-data; boundary=b"},
            b'--b\r\nContent-Disposition: form-data; name="token"\r\n\r\nT2\r\n--b--\r\n',
        ),
    ),
    (
        "telegram-bot",
        (f"/bot{TG}/sendMessage", JSON, b'{"chat_id": 1, "text": "hi"}'),
        (f"/bot{TG[:-1]}X/sendMessage", JSON, b'{"chat_id": 1, "text": "hi"}'),
    ),
    (
        "discord-webhook",
        ("/api/webhooks/1/aaaa", JSON, b'{"content": "hi"}'),
        ("/api/webhooks/1/bbbb", JSON, b'{"content": "hi"}'),
    ),
    ("slack-webhook", ("/services/T1/B1/aaaaaaaa", JSON, b"{}"), ("/services/T1/B1/bbbbbbbb", JSON, b"{}")),
    (
        "token-shaped-header",
        ("/v1/things", {**JSON, "x-custom": "Bearer " + GHP}, b"{}"),
        ("/v1/things", {**JSON, "x-custom": "Bearer " + GHP[:-1] + "X"}, b"{}"),
    ),
    ("token-shaped-query", ("/v1/things?s=" + GHP, JSON, b"{}"), ("/v1/things?s=" + GHP[:-1] + "X", JSON, b"{}")),
]


@pytest.mark.parametrize("a, b", [pytest.param(a, b, id=i) for i, a, b in TWO_CALLERS])
def test_two_callers_that_differ_only_by_a_credential_are_two_intents(a, b):
    one, two, again = pin(*a), pin(*b), pin(*a)
    assert one.principal != two.principal and one.fingerprint != two.fingerprint
    assert one.principal.startswith("hmac:") and not one.unidentified
    assert (again.principal, again.fingerprint) == (one.principal, one.fingerprint)  # a retry is a retry


# Parts that change between a request and its retry never count: the retry keeps its principal.
@pytest.mark.parametrize(
    "a, b",
    [
        pytest.param({"x-signature": "s1"}, {"x-signature": "s2"}, id="signature-header"),
        pytest.param({"mcp-session-id": "s1"}, {"mcp-session-id": "s2"}, id="mcp-session"),
        pytest.param({"x-csrf-token": "c1"}, {"x-csrf-token": "c2"}, id="csrf-token"),
        pytest.param({"proxy-authorization": "Basic a"}, {"proxy-authorization": "Basic b"}, id="proxy-authorization"),
        pytest.param({"idempotency-key": "k1"}, {"idempotency-key": "k2"}, id="idempotency-key"),
        pytest.param({"cookie": "s=1"}, {"cookie": "s=2"}, id="cookie-beside-a-credential"),
        pytest.param({"x-request-id": GHP}, {"x-request-id": GHP}, id="same-shape-same-principal"),
    ],
)
def test_what_changes_between_retries_never_counts(a, b):
    base = {**JSON, "x-api-key": "K1"}
    one = pin("/v1/things?page_token=p1&nonce=n1", {**base, **a}, b'{"title": "t"}')
    two = pin("/v1/things?page_token=p2&nonce=n2", {**base, **b}, b'{"title": "t"}')
    assert one.principal == two.principal


def test_a_token_mentioned_in_text_is_not_a_credential():
    text = json.dumps({"title": f"rotate {GHP} today"}).encode()
    assert pin("/v1/things", JSON, text).principal == "anonymous"
    assert not token_shaped(f"rotate {GHP} today")


def test_cookie_counts_only_when_nothing_else_does():
    alone = pin("/v1/things", {**JSON, "cookie": "s=1"}, b"{}")
    assert alone.counted == ("cookie",)
    beside = pin("/v1/things?api_key=K", {**JSON, "cookie": "s=1"}, b"{}")
    assert beside.counted == ("query:api_key",)


def test_a_caller_that_cannot_be_told_apart_is_unidentified_and_never_replayed():
    one = pin("/v1/things?sig=s1", JSON, b'{"title": "t"}')
    two = pin("/v1/things?sig=s2", JSON, b'{"title": "t"}')
    assert one.unidentified == ("query:sig",) and one.counted == ()
    assert one.principal.startswith("hmac:") and one.principal != two.principal  # the same bytes only
    m = PIN.match("api.pin.test", 443, "POST", "/v1/things?sig=s1")
    assert m is not None
    attempt = build_attempt(m, view("/v1/things?sig=s1", JSON, b'{"title": "t"}'), KEY)
    assert attempt.unreplayable == (attempt.intent_fingerprint,)
    assert pin("/v1/things", JSON, b'{"title": "t"}').principal == "anonymous"  # nothing credential-like: anonymous


def test_mcp_arguments_named_like_credentials_count():
    rules = RuleSet.of(
        [
            load_rules(
                "api: t\nhosts: [mcp.test]\noperations:\n  send:\n"
                "    match: {method: POST, path: /mcp, mcp: {tool: send}}\n"
                "    fingerprint: {body: [params.arguments.text]}\n",
                "t.yaml",
            )
        ]
    )

    def call(key: str):
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "send", "arguments": {"text": "hi", "api_key": key}},
            }
        ).encode()
        m = rules.match("mcp.test", 443, "POST", "/mcp", body=body, headers=[])
        assert m is not None
        return fingerprint(m, view("/mcp", JSON, body, host="mcp.test"), KEY)

    assert call("K1").counted == ("body:params.arguments.api_key",)
    assert call("K1").principal != call("K2").principal


# --- declared credentials ----------------------------------------------------------------------

DECLARED = """\
api: dec
hosts: [api.dec.test]
credentials: {header: X-Key, query: [k], body: [login.secret, "auth[key]"], path: [room]}
operations:
  send:
    match: {method: POST, path: "/rooms/{room}/send"}
    fingerprint: {body: [text]}
  plain:
    credentials: {query: q2, path: [id]}
    match: {method: POST, path: "/things/{id}"}
    fingerprint: {body: [text]}
"""


def declared(path: str, headers: dict[str, str], body: bytes, scheme: int = 3):
    rules = RuleSet.of([load_rules(DECLARED, "dec.yaml")])
    m = rules.match("api.dec.test", 443, "POST", path)
    assert m is not None
    return fingerprint(m, view(path, headers, body, host="api.dec.test"), KEY, scheme=scheme)


def test_declared_credentials_in_the_query_the_body_and_the_path_count():
    ops = {op.name: op for op in RuleSet.of([load_rules(DECLARED, "dec.yaml")]).operations}
    assert ops["send"].credential_headers == ("x-key",) and ops["send"].credential_query == ("k",)
    assert ops["send"].credential_body == ("login.secret", "auth[key]") and ops["send"].credential_path == ("room",)
    assert ops["plain"].credential_query == ("k", "q2") and ops["plain"].credential_path == ("id",)  # file's + own
    body = b'{"text": "hi", "login": {"secret": "S"}}'
    got = declared("/rooms/r1/send?k=1", JSON, body)
    assert got.counted == ("body:login.secret", "path:room", "query:k")
    assert got.principal != declared("/rooms/r1/send?k=2", JSON, body).principal
    assert got.principal != declared("/rooms/r1/send?k=1", JSON, body.replace(b'"S"', b'"T"')).principal
    form = declared("/rooms/r1/send", FORM, b"text=hi&auth%5Bkey%5D=F1")
    assert form.counted == ("body:auth[key]", "path:room")
    assert form.principal != declared("/rooms/r1/send", FORM, b"text=hi&auth%5Bkey%5D=F2").principal
    # scheme 2 knew no such declarations: the principal it gave
    assert declared("/rooms/r1/send?k=1", JSON, body, scheme=2).principal == "anonymous"


def test_a_path_credential_is_a_keyed_hash_in_the_intent_and_redacted_in_the_targets():
    got = declared("/rooms/r00m-5ecret/send", JSON, b'{"text": "hi"}')
    assert got.intent["path"]["room"].startswith("hmac:")
    assert got.target == f"https://api.dec.test/rooms/{REDACTED}/send"
    assert "r00m-5ecret" not in json.dumps(got.intent)
    assert (
        declared("/rooms/r00m-5ecret/send", JSON, b'{"text": "hi"}', scheme=2).intent["path"]["room"] == "r00m-5ecret"
    )
    tg = pin(f"//bot{TG.replace(':', '%3A')}/sendMessage", JSON, b'{"chat_id": 1, "text": "x"}')
    assert tg.target == f"https://api.pin.test/{REDACTED}/sendMessage"
    assert tg.raw_target == f"https://api.pin.test//{REDACTED}/sendMessage"
    assert tg.intent["path"]["token"].startswith("hmac:")
    assert TG.split(":")[1] not in json.dumps([tg.target, tg.raw_target, tg.intent])
    hook = pin("/services/T1/B2/abcdefgh", JSON, b"{}")
    assert hook.target == f"https://api.pin.test/services/T1/B2/{REDACTED}"
    assert hook.intent["path"] == {"team": "T1", "bot": "B2", "secret": hook.intent["path"]["secret"]}


@pytest.mark.parametrize(
    "path, expected",
    [
        (f"/bot{TG}/getMe", f"/{REDACTED}/getMe"),
        (f"/bot{TG.replace(':', '%3a')}/getMe", f"/{REDACTED}/getMe"),
        ("/services/T0AB/B0CD/s3cr3tS3cr3t?x=1", f"/services/T0AB/B0CD/{REDACTED}?x={REDACTED}"),
        ("/api/v10/webhooks/42/tok_en/messages", f"/api/v10/webhooks/42/{REDACTED}/messages"),
        (f"/v1/keys/{GHP}", f"/v1/keys/{REDACTED}"),
        ("/v1/users/eyJhbGciOiJI.eyJzdWIiOiIx.sig/x", f"/v1/users/{REDACTED}/x"),
        ("/v1/items/12345/comments", "/v1/items/12345/comments"),
    ],
)
def test_a_url_never_shows_a_token_in_its_path(path, expected):
    assert redact_url("https", "h.test", 443, path) == f"https://h.test{expected}"


RULE_PROBLEMS = [
    ("credentials: {env: K}", "credentials", "name at least one of header, query, body, path"),
    ("credentials: {path: [nope]}", "credentials.path", "'nope' is a parameter of no operation's path in this file"),
    ("credentials: {body: ['a b']}", "credentials.body", "'a b' is not a field name or a dotted path"),
    (
        "credentials: {query: [k]}\n    fingerprint: {query: [k]}",
        "operations.send.fingerprint.query",
        "'k' is declared a credential (credentials.query); it never enters a fingerprint",
    ),
    (
        "credentials: {path: [other]}",
        "operations.send.credentials.path",
        "'other' is not a parameter of '/rooms/{room}/send' (it has: room)",
    ),
    (
        "reconcile: {read: {url: '/rooms/{path.webhook_token}'}}",
        "operations.send.reconcile.read.url",
        "{path.webhook_token} carries a credential",
    ),
]


@pytest.mark.parametrize("extra, where, message", RULE_PROBLEMS)
def test_credentials_the_loader_refuses(extra, where, message):
    file_level = (
        extra.startswith("credentials: {env")
        or extra.startswith("credentials: {path: [nope]")
        or extra.startswith("credentials: {body")
    )
    text = (
        "api: r\nhosts: [r.test]\n"
        + (extra + "\n" if file_level else "")
        + "operations:\n  send:\n"
        + (
            "    match: {method: POST, path: '/rooms/{webhook_token}/send'}\n"
            if "webhook_token" in extra
            else "    match: {method: POST, path: '/rooms/{room}/send'}\n"
        )
        + ("" if file_level else f"    {extra}\n")
    )
    problems = check_rules(text, "r.yaml")
    assert any(p.field == where and message in p.message for p in problems), [str(p) for p in problems]
    with pytest.raises(RulesError):
        load_rules(text, "r.yaml")


def test_an_old_rules_description_is_read_without_the_new_places():
    op = RuleSet.of([load_rules(DECLARED, "dec.yaml")]).operation("dec", "send")
    assert op is not None
    old = {k: v for k, v in op.fingerprint_rule().items() if not k.startswith("credential_") or k.endswith("headers")}
    before = op.under_rule(old)
    assert (before.credential_query, before.credential_body, before.credential_path) == ((), (), ())
    again = op.under_rule(op.fingerprint_rule())
    assert again.rule_digest == op.rule_digest and again.credential_path == ("room",)
    edited = RuleSet.of([load_rules(DECLARED.replace("query: [k]", "query: [k, k2]"), "dec.yaml")])
    edited_op = edited.operation("dec", "send")
    assert edited_op is not None and edited_op.rule_digest != op.rule_digest  # an edit of a place is an edited rule
    with pytest.raises(ValueError):
        op.under_rule({**op.fingerprint_rule(), "credential_query": "k"})


# --- replay across schemes and callers (the store) ---------------------------------------------


def test_an_earlier_schemes_success_blind_to_a_credential_is_blocked_never_replayed(tmp_path):
    """A success recorded under scheme 2, which saw no bot token, may be another bot's: its retry
    after the upgrade is blocked (409), neither replayed another bot's answer nor sent twice."""
    store = open_store(str(tmp_path / "r.db"), clock=FakeClock())
    try:
        path, body = f"/bot{TG}/sendMessage", b'{"chat_id": 42, "text": "hi"}'
        m = PIN.match("api.pin.test", 443, "POST", path)
        assert m is not None
        old = build_attempt(m, view(path, JSON, body), KEY)
        old = type(old)(
            **{
                **old.__dict__,
                "intent_fingerprint": pin(path, JSON, body, scheme=2).fingerprint,
                "fingerprint_scheme": 2,
            }
        )
        first = store.begin_attempt(old)
        store.transition(
            first.receipt.operation_id,
            State.SUCCEEDED,
            reason="HTTP 200",
            http_status=200,
            response=RecordedResponse(200, [], b'{"ok": true, "result": {"message_id": 1}}'),
        )
        retry = build_attempt(m, view(path, JSON, body), KEY, versions=[Version(2, None, False)])
        assert old.intent_fingerprint in retry.earlier and old.intent_fingerprint in retry.unreplayable
        d = store.begin_attempt(retry)
        assert (d.kind, d.receipt.operation_id) == ("blocked_succeeded", first.receipt.operation_id)
        # A request whose every credential scheme 2 saw (Authorization) is still replayed across the upgrade.
        auth = {**JSON, "authorization": "Bearer A"}
        m2 = PIN.match("api.pin.test", 443, "POST", "/v1/things")
        assert m2 is not None
        seen = build_attempt(m2, view("/v1/things", auth, b'{"title": "t"}'), KEY, versions=[Version(2, None, False)])
        assert seen.unreplayable == ()
    finally:
        store.close()


def test_the_principal_of_headers_alone_is_scheme_2s_when_only_credential_headers_are_sent():
    op = PIN.operation("pin", "things.create")
    assert op is not None
    for headers in ({"api-key": "K"}, {"authorization": "Bearer A"}, {"cookie": "c=1"}):
        assert caller_of(op, headers, KEY, scheme=3).principal == caller_of(op, headers, KEY, scheme=2).principal


def test_a_write_keeps_the_principal_of_its_credential_headers_when_more_made_its_own():
    """`receipts reconcile` checks a read's headers against it (tests/e2e/reconcile/test_principal.py)."""
    m = PIN.match("api.pin.test", 443, "POST", "/v1/things?api_key=Q")
    assert m is not None
    both = build_attempt(m, view("/v1/things?api_key=Q", {**JSON, "api-key": "A"}, b"{}"), KEY)
    alone = build_attempt(m, view("/v1/things", {**JSON, "api-key": "A"}, b"{}"), KEY)
    assert both.principal != alone.principal and alone.read_principal is None
    assert both.read_principal == alone.principal


def test_rules_explain_says_which_parts_make_the_principal_and_never_shows_them():
    from proxy_addon.explain import explain, render

    text = render(
        explain(
            PIN,
            "POST",
            f"https://api.pin.test/bot{TG}/sendMessage?api_key=QK",
            b'{"chat_id": 1}',
            {"content-type": "application/json", "x-custom": "Bearer " + GHP},
            KEY,
        )
    )
    assert "a keyed hash of x-custom, path:token, query:api_key" in text
    assert "/REDACTED/sendMessage?api_key=REDACTED" in text and "x-custom: REDACTED" in text
    assert TG.split(":")[1] not in text and GHP not in text and "QK" not in text
    odd = render(
        explain(
            PIN,
            "POST",
            "https://api.pin.test/v1/things?sig=S",
            b'{"title": "t"}',
            {"content-type": "application/json"},
            KEY,
        )
    )
    assert "no credential tells this caller apart: a keyed hash of query:sig" in odd
    assert "a success is never replayed to it" in odd
