"""
What an intent stores, and what a stored or logged URL shows: deny by default.

- Strings that enter a fingerprint are NFC: `café` composed or decomposed is one intent.
- A named field holding an object (or a list of objects) is stored as a keyed hash of it:
  different objects still differ, but no leaf of an object the rule did not name is stored.
- When the named fields cannot be read as the rule says, the intent records which fallback
  was used (and the notes never change the fingerprint); build_attempt logs one line.
- A stored target keeps only the query values the fingerprint names; a read's shown URL only
  those its template writes.
Names on no list through a real proxy: tests/e2e/proxy/test_intent_secrets.py.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from pathlib import Path

import pytest

from proxy_addon import explain
from proxy_addon.errors import ReconcileError
from proxy_addon.intent.fingerprint import RequestView, build_attempt, fingerprint, intent_notes
from proxy_addon.reconcile.http_reads import plan_read
from proxy_addon.rules import RuleSet, load_rules
from proxy_addon.store import Store
from proxy_addon.wire.redaction import REDACTED

KEY = b"k" * 64


NFC, NFD = unicodedata.normalize("NFC", "café crème"), unicodedata.normalize("NFD", "café crème")


assert NFC != NFD


RULES = """\
api: shop
hosts: [api.shop.test]
credentials: {header: api-key}
operations:
  orders.create:
    match: {method: POST, path: /v1/orders}
    fingerprint: {body: [title, meta, lines, tags, "café"], query: [page]}
    external_id: id
    reconcile:
      read: {url: "/v1/orders?page=2&title={intent.title}&meta={intent.meta}"}
      find: {title: "{intent.title}"}
  forms.create:
    match: {method: POST, path: /v1/forms}
    fingerprint: {body: [title, sku]}
  uploads.create:
    match: {method: POST, path: /v1/uploads}
    fingerprint: {body: [title, file]}
  issues.create:
    match: {method: POST, path: /graphql, graphql: issueCreate}
    fingerprint: {body: [input.title]}
"""


RS = RuleSet.of([load_rules(RULES, "t.yaml")])


JSON = {"content-type": "application/json"}


FORM = {"content-type": "application/x-www-form-urlencoded"}


def fp(path: str, body: bytes, headers: dict[str, str] | None = None, method: str = "POST"):
    headers = JSON if headers is None else headers
    m = RS.match("api.shop.test", 443, method, path, body=body)
    assert m is not None
    return fingerprint(m, RequestView(method, "https", "api.shop.test", 443, path, headers, body), KEY)


def j(doc) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode()


@pytest.mark.parametrize(
    "path, make, headers",
    [
        pytest.param("/v1/orders", lambda t: j({"title": t}), JSON, id="json-value"),
        pytest.param("/v1/orders", lambda t: j({"title": "x", "café": t}), JSON, id="json-key-named-nfc"),
        pytest.param(
            "/v1/orders",
            lambda t: j({"title": "x", unicodedata.normalize("NFD", "café"): t}),
            JSON,
            id="json-key-sent-nfd",
        ),
        pytest.param("/v1/orders", lambda t: j({"title": "x", "meta": {t: t}}), JSON, id="inside-a-hashed-object"),
        pytest.param("/v1/forms", lambda t: f"title={t}&sku=1".encode(), FORM, id="form-value"),
        pytest.param("/v1/orders?page=" + "{t}", lambda t: j({"title": "x"}), JSON, id="query-value"),
        pytest.param(
            "/graphql",
            lambda t: j({"query": f'mutation {{ issueCreate(input: {{title: "{t}"}}) {{ id }} }}'}),
            JSON,
            id="graphql-argument",
        ),
    ],
)
def test_nfc_and_nfd_are_one_intent(path, make, headers):
    a = fp(path.replace("{t}", NFC), make(NFC), headers)
    b = fp(path.replace("{t}", NFD), make(NFD), headers)
    assert a.fingerprint == b.fingerprint
    assert a.intent == b.intent
    assert NFD not in json.dumps(b.intent, ensure_ascii=False)  # stored composed
    other = fp(path.replace("{t}", "cafe creme"), make("cafe creme"), headers)
    assert other.fingerprint != a.fingerprint  # NFC is not accent-folding


def test_multipart_text_parts_are_nfc():
    def body(t: str) -> bytes:
        return (
            b'--B\r\nContent-Disposition: form-data; name="title"\r\n\r\n'
            + t.encode()
            + b'\r\n--B\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n\r\nDATA\r\n--B--\r\n'
        )

    ct = {"content-type": "multipart/form-data; boundary=B"}
    a, b = fp("/v1/uploads", body(NFC), ct), fp("/v1/uploads", body(NFD), ct)
    assert a.fingerprint == b.fingerprint and b.intent["multipart"]["title"] == NFC
    assert b.intent["multipart"]["file"]["size"] == 4  # a file part stays the proxy's own summary, not a hash
    assert "hashed" not in b.intent


def test_a_named_object_is_stored_as_a_keyed_hash_and_still_tells_objects_apart():
    secret = "SECRET-in-an-unnamed-leaf"
    a = fp("/v1/orders", j({"title": "t", "meta": {"access_token": secret, "n": 1}}))
    assert secret not in json.dumps(a.intent) and "access_token" not in json.dumps(a.intent)
    assert a.intent["body"]["meta"].startswith("hmac:")
    assert a.intent["hashed"] == ["meta"]
    same = fp("/v1/orders", b'{"meta": {"n": 1,   "access_token": "%s"}, "title": "t"}' % secret.encode())
    assert same.fingerprint == a.fingerprint  # key order and whitespace inside the object do not matter
    other = fp("/v1/orders", j({"title": "t", "meta": {"access_token": "another", "n": 1}}))
    assert other.fingerprint != a.fingerprint  # a different object is a different intent
    assert fingerprint_with_key(b"x" * 64, a) != a.intent["body"]["meta"]  # keyed: not a bare hash anyone can test


def fingerprint_with_key(key: bytes, like) -> str:
    m = RS.match("api.shop.test", 443, "POST", "/v1/orders")
    assert m is not None
    body = j({"title": "t", "meta": {"access_token": "SECRET-in-an-unnamed-leaf", "n": 1}})
    return fingerprint(m, RequestView("POST", "https", "api.shop.test", 443, "/v1/orders", JSON, body), key).intent[
        "body"
    ]["meta"]


def test_a_list_of_objects_is_hashed_and_a_list_of_scalars_is_kept():
    r = fp("/v1/orders", j({"title": "t", "lines": [{"sku": "A", "card": "4242"}], "tags": ["a", "b"]}))
    assert r.intent["body"]["lines"].startswith("hmac:") and "4242" not in json.dumps(r.intent)
    assert r.intent["body"]["tags"] == ["a", "b"]  # a repeated value, as a repeated form field: kept
    assert r.intent["hashed"] == ["lines"]


def test_a_read_template_naming_a_hashed_field_fails_to_plan_instead_of_looking_for_the_hash(tmp_path):
    m = RS.match("api.shop.test", 443, "POST", "/v1/orders")
    assert m is not None
    op = m.operation
    receipt = recorded(tmp_path, "/v1/orders", j({"title": "t", "meta": {"x": 1}}))
    with pytest.raises(ReconcileError, match=r"\{intent.meta\} has no value"):
        plan_read(op, receipt)


def test_json_sent_as_form_is_read_as_json_and_says_so():
    """`curl -d '{"title": ...}'` sends a JSON body with the form content type."""
    as_json = fp("/v1/forms", j({"title": "a=b", "sku": "1"}))
    as_form = fp("/v1/forms", j({"title": "a=b", "sku": "1"}), FORM)
    assert as_form.intent == {**as_json.intent, "fallback": "json_sent_as_form"}
    assert as_form.fingerprint == as_json.fingerprint  # the same fields: one intent, however declared
    assert "curl -d" in intent_notes(as_form.intent)[0]


@pytest.mark.parametrize(
    "path, body, headers, fallback",
    [
        pytest.param("/v1/orders", b"<xml/>", JSON, "not_json", id="not-json"),
        pytest.param("/v1/orders", b"[1, 2]", JSON, "not_a_json_object", id="a-json-list"),
        pytest.param("/v1/orders", j({"name": "x"}), JSON, "no_named_field", id="none-of-the-fields"),
        pytest.param("/v1/forms", b"name=x", FORM, "no_named_field", id="form-without-the-fields"),
        pytest.param("/v1/forms", b"plain text", FORM, "bad_form", id="not-a-form"),
        pytest.param(
            "/v1/uploads",
            b"--B\r\nbroken",
            {"content-type": "multipart/form-data; boundary=B"},
            "bad_multipart",
            id="broken-multipart",
        ),
        pytest.param("/v1/orders", b"", JSON, "empty", id="empty"),
    ],
)
def test_each_fallback_is_recorded_and_hashes_the_whole_body(path, body, headers, fallback):
    r = fp(path, body, headers)
    assert r.intent["fallback"] == fallback and "body_sha256" in r.intent
    assert intent_notes(r.intent) and fallback in intent_notes(r.intent)[0]
    different = fp(path, body + b" ", headers)
    assert different.fingerprint != r.fingerprint  # never one intent for different bodies


def test_missing_fields_count_as_null_and_are_noted():
    r = fp("/v1/orders", j({"title": "t"}))
    assert r.intent["body"]["meta"] is None and r.intent["missing"] == ["meta", "lines", "tags", "café"]
    explicit = fp("/v1/orders", j({"title": "t", "meta": None, "lines": None, "tags": None, "café": None}))
    assert explicit.fingerprint == r.fingerprint and "missing" not in explicit.intent


def test_build_attempt_logs_the_fallback_once_without_values(caplog):
    m = RS.match("api.shop.test", 443, "POST", "/v1/forms")
    assert m is not None
    body = j({"title": "SECRET-TITLE-VALUE", "sku": "1"})
    view = RequestView("POST", "https", "api.shop.test", 443, "/v1/forms?jwt=SECRET-JWT", FORM, body)
    with caplog.at_level(logging.WARNING, logger="proxy_addon.intent.fingerprint"):
        attempt = build_attempt(m, view, KEY)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "json_sent_as_form" in line and "shop forms.create" in line
    assert "SECRET" not in line and f"jwt={REDACTED}" in line
    assert attempt.intent["fallback"] == "json_sent_as_form"


def test_the_stored_target_keeps_only_the_query_values_the_fingerprint_names():
    names = ["jwt", "access_key", "pass", "private_key", "x_thing", "q"]
    r = fp("/v1/orders?page=3&" + "&".join(f"{n}=SECRET-{n}" for n in names), j({"title": "t"}))
    assert "SECRET" not in r.target
    assert r.target == "https://api.shop.test/v1/orders?page=3&" + "&".join(f"{n}={REDACTED}" for n in names)


def recorded(tmp_path: Path, path: str, body: bytes):
    m = RS.match("api.shop.test", 443, "POST", path.split("?")[0])
    assert m is not None
    store = Store.open(tmp_path / "r.db")
    attempt = build_attempt(m, RequestView("POST", "https", "api.shop.test", 443, path, JSON, body), KEY)
    return store.begin_attempt(attempt).receipt


def test_a_reads_shown_url_keeps_what_its_template_writes(tmp_path):
    rules = RuleSet.of([load_rules(RULES.replace("&meta={intent.meta}", ""), "t.yaml")])
    m = rules.match("api.shop.test", 443, "POST", "/v1/orders")
    assert m is not None
    op = m.operation
    receipt = recorded(tmp_path, "/v1/orders?x_thing=SECRET-X", j({"title": "Mug"}))
    read = plan_read(op, receipt)
    assert read.shown == "https://api.shop.test/v1/orders?page=2&title=Mug"
    widened = type(read)(read.method, read.url + "&x_thing=SECRET-X", keep=read.keep)
    assert widened.shown.endswith(f"title=Mug&x_thing={REDACTED}")  # not from the template: redacted


def test_rules_explain_names_the_fallback_and_the_hashed_object():
    report = explain.explain(
        RS,
        "POST",
        "https://api.shop.test/v1/orders?jwt=SECRET-J&page=1",
        j({"title": "t", "meta": {"token": "SECRET-M"}}),
        JSON,
        KEY,
    )
    text = explain.render(report)
    assert "SECRET" not in text
    assert f"jwt={REDACTED}&page=1" in text
    assert "note: named fields that hold an object" in text and "meta" in text
    assert "fallback" not in report["fingerprint"]["fields"] and "hashed" not in report["fingerprint"]["fields"]
    curl_d = explain.render(explain.explain(RS, "POST", "https://api.shop.test/v1/forms", j({"title": "x"}), FORM))
    assert "note: fallback json_sent_as_form" in curl_d


def test_the_receipt_view_says_which_fallback_was_used(tmp_path):
    from proxy_addon.mitm.web import describe

    receipt = recorded(tmp_path, "/v1/orders", b"<not json/>")
    text = describe(Store.open(tmp_path / "r.db"), receipt.operation_id)
    assert '"fallback": "not_json"' in text
    assert "how the body was read" in text and "fallback not_json: the body is not JSON" in text
