"""
Method overrides through a real proxy (issue 17, item 4), to an upstream that honours them as
Rack and Express's method-override do (tests/upstream.py OverrideUpstream): `GET` with
`X-HTTP-Method-Override: POST` is a POST there, and commits.

Each overridden write gets a receipt recording the method it names and how it was sent; it is
one intent with the same write sent plainly (the second is replayed, or blocked while the first
is unresolved), and the upstream sees one write, forwarded as the agent sent it (the GET and
its header). Override headers that name different methods, or any override where the rule says
`method_override: refuse`, get 400 and nothing is sent.

Before the proxy read these headers, every override below went upstream without a receipt, and
the second one made a second write (issue 17: "Method overrides skip the rules").
"""

from __future__ import annotations

import pytest

from proxy_addon.store import Store
from tests.e2e.processes import Clients, Proxy
from tests.upstream import OverrideUpstream

RULES = """\
api: override-api
hosts: [127.0.0.1]
credentials: {header: api-key}
operations:
  things.create:
    match: {method: POST, path: "/api/{bucket}/things"}
    fingerprint: {body: [title]}
    external_id: id
  things.update:
    match: {method: PUT, path: "/api/{bucket}/things/{id}"}
    fingerprint: {body: [title]}
  strict.create:
    description: an endpoint the rule says takes no method override header
    match: {method: POST, path: "/api/{bucket}/strict", method_override: refuse}
    fingerprint: {body: [title]}
"""
# A whole API that does not take them: every operation of the file refuses.
STRICT_RULES = """\
api: strict-api
hosts: [127.0.0.1]
method_override: refuse
operations:
  notes.create:
    match: {method: POST, path: "/strict/{bucket}/notes"}
    fingerprint: {body: [title]}
"""

XO = "X-HTTP-Method-Override"


@pytest.fixture(scope="module")
def over():
    with OverrideUpstream() as up:
        yield up


@pytest.fixture(scope="module")
def over_proxy(tmp_path_factory, confdir):
    work = tmp_path_factory.mktemp("override-proxy")
    rules = work / "rules"
    rules.mkdir()
    (rules / "override.yaml").write_text(RULES)
    (rules / "strict.yaml").write_text(STRICT_RULES)
    p = Proxy(work, confdir, rules=rules).start()
    yield p
    p.stop()


@pytest.fixture
def over_clients(over_proxy) -> Clients:
    return Clients(over_proxy)


def receipts_of(proxy: Proxy, bucket: str) -> list:
    store = Store.open(proxy.db, create=False)
    try:
        return [r for r in store.list(limit=None) if bucket in r.target]
    finally:
        store.close()


def last_event(proxy: Proxy, operation_id: str) -> tuple[str, str | None, str]:
    store = Store.open(proxy.db, create=False)
    try:
        e = store.events(operation_id)[-1]
        return e.event, e.from_state, e.to_state
    finally:
        store.close()


def arrived(up: OverrideUpstream, bucket: str) -> list[dict]:
    """Every request of this bucket that reached the upstream, reads and writes."""
    with up.lock:
        return [r for r in up.requests if bucket in r["path"]]


def overridden(up: OverrideUpstream, bucket: str) -> list[tuple[str, str]]:
    """(method sent, method handled as) of each request of this bucket the upstream took by its override header."""
    with up.lock:
        return [(sent, handled) for sent, handled, path in up.overrides if bucket in path]


# (id, the method sent, its override header and value, the rule's method, the path); {b}: the bucket
OVERRIDES = [
    ("get-as-post", "GET", (XO, "POST"), "POST", "/api/{b}/things"),
    ("post-as-put", "POST", (XO, "PUT"), "PUT", "/api/{b}/things/7"),
    ("x-http-method", "GET", ("X-HTTP-Method", "POST"), "POST", "/api/{b}/things"),
    ("x-method-override-lower-case", "POST", ("x-method-override", "put"), "PUT", "/api/{b}/things/7"),
]


@pytest.mark.parametrize("sent, header, means, path", [o[1:] for o in OVERRIDES], ids=[o[0] for o in OVERRIDES])
def test_an_overridden_write_gets_a_receipt_and_is_one_write_with_the_plain_one(
    sent, header, means, path, over_proxy, over_clients, over, bucket
):
    url = over.url + path.format(b=bucket)
    body = {"title": "one write"}
    first = over_clients.send("requests", sent, url, body, headers=dict([header]))
    assert first.status == 201, first
    assert first.headers.get("x-receipt-id"), "the override slipped past the rules: no receipt"
    (sent_request,) = arrived(over, bucket)
    assert {k.lower(): v for k, v in sent_request["headers"].items()}[header[0].lower()] == header[1]
    assert overridden(over, bucket) == [(sent, means)]  # forwarded as sent: the upstream took the header

    (receipt,) = receipts_of(over_proxy, bucket)
    assert receipt.operation_id == first.headers["x-receipt-id"]
    assert receipt.method == means  # the method it means...
    canonical_header = {h.lower(): h for h in (XO, "X-HTTP-Method", "X-Method-Override")}[header[0].lower()]
    assert receipt.intent["method_override"] == {  # ...and how it was sent
        "sent": sent,
        "override": f"{canonical_header}: {means}",
        "matched": means,
    }

    plain = over_clients.send("httpx", means, url, body)  # the same write, sent plainly: replayed
    overridden_again = over_clients.send("curl", sent, url, body, headers=dict([header]))  # and overridden again
    for again in (plain, overridden_again):
        assert again.status == 201, again
        assert (again.headers["x-receipt-id"], again.headers["x-receipt-replayed"]) == (receipt.operation_id, "true")
        assert again.body == first.body
    assert over.commits(path.format(b=bucket)) == 1
    assert len(arrived(over, bucket)) == 1
    assert [r.operation_id for r in receipts_of(over_proxy, bucket)] == [receipt.operation_id]
    assert last_event(over_proxy, receipt.operation_id) == ("replayed", "succeeded", "succeeded")


@pytest.mark.parametrize("first_overridden", [True, False], ids=["override-then-plain", "plain-then-override"])
def test_a_second_write_while_the_first_is_unresolved_is_blocked(
    first_overridden, over_proxy, over_clients, over, bucket
):
    path = f"/api/{bucket}/things"
    over.plan(path, "drop")  # commits, then drops the connection: outcome_unknown
    as_get = ("GET", {XO: "POST"})
    as_post: tuple[str, dict[str, str]] = ("POST", {})
    (m1, h1), (m2, h2) = (as_get, as_post) if first_overridden else (as_post, as_get)
    first = over_clients.send("requests", m1, over.url + path, {"title": "unresolved"}, headers=h1)
    assert first.status == 502 and first.json()["error"] == "outcome_unknown", first
    second = over_clients.send("requests", m2, over.url + path, {"title": "unresolved"}, headers=h2)
    assert second.status == 409, second
    assert (second.json()["error"], second.json()["state"]) == ("duplicate_unresolved", "outcome_unknown")
    assert second.headers["x-receipt-id"] == first.headers["x-receipt-id"]
    assert over.commits(path) == 1
    assert len(arrived(over, bucket)) == 1
    (receipt,) = receipts_of(over_proxy, bucket)
    assert (receipt.state, receipt.method) == ("outcome_unknown", "POST")
    assert last_event(over_proxy, receipt.operation_id) == ("blocked", "outcome_unknown", "outcome_unknown")


CONFLICTS = [
    ("two-headers", "GET", [(XO, "POST"), ("X-HTTP-Method", "PUT")], "/api/{b}/things"),
    ("one-header-two-values", "POST", [(XO, "PUT, DELETE")], "/api/{b}/things/7"),
    ("names-the-sent-method-and-another", "POST", [(XO, "POST"), ("X-Method-Override", "PUT")], "/api/{b}/things/7"),
]


@pytest.mark.parametrize("sent, headers, path", [c[1:] for c in CONFLICTS], ids=[c[0] for c in CONFLICTS])
def test_override_headers_that_name_different_methods_are_refused(
    sent, headers, path, over_proxy, over_clients, over, bucket
):
    answer = over_clients.send(
        "curl", sent, over.url + path.format(b=bucket), {"title": "which?"}, headers=dict(headers)
    )
    assert answer.status == 400, answer
    doc = answer.json()
    assert (doc["error"], doc["sent"], doc["api"]) == ("method_override_refused", False, "override-api")
    assert "name different methods" in doc["detail"]
    assert arrived(over, bucket) == []  # nothing was sent
    assert receipts_of(over_proxy, bucket) == []  # and no receipt recorded
    assert "NOT forwarded" in over_proxy.log() and "name different methods" in over_proxy.log()


REFUSED = [
    ("operation-get-as-post", "GET", "POST", "/api/{b}/strict", "strict.create"),
    ("operation-post-as-get", "POST", "GET", "/api/{b}/strict", "strict.create"),
    ("file-get-as-post", "GET", "POST", "/strict/{b}/notes", "notes.create"),
    ("file-post-as-put", "POST", "PUT", "/strict/{b}/notes", "notes.create"),
]


@pytest.mark.parametrize("sent, named, path, operation", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_method_override_refuse_answers_400_and_sends_nothing(
    sent, named, path, operation, over_proxy, over_clients, over, bucket
):
    url = over.url + path.format(b=bucket)
    answer = over_clients.send("requests", sent, url, {"title": "strict"}, headers={XO: named})
    assert answer.status == 400, answer
    doc = answer.json()
    assert (doc["error"], doc["sent"], doc["operation"]) == ("method_override_refused", False, operation)
    assert "method_override: refuse" in doc["detail"] and "without them" in doc["detail"]
    assert arrived(over, bucket) == [] and over.commits(path.format(b=bucket)) == 0
    assert receipts_of(over_proxy, bucket) == []
    plain = over_clients.send("requests", "POST", url, {"title": "strict"})  # sent as it means: as any write
    assert plain.status == 201 and plain.headers.get("x-receipt-id")
    assert over.commits(path.format(b=bucket)) == 1


def test_an_override_to_a_method_no_rule_has_is_refused(over_proxy, over_clients, over, bucket):
    """
    POST naming GET, to a ruled POST path: a server that honours the header reads, one that ignores it writes.
    Passing it through would skip a receipt for the write; recording it as the POST would record a read's answer
    as the write's success, and replay it to the real POST. The proxy cannot tell which, so it refuses.
    """
    path = f"/api/{bucket}/things"
    answer = over_clients.send("requests", "POST", over.url + path, {"title": "read?"}, headers={XO: "GET"})
    assert answer.status == 400, answer
    assert answer.json()["error"] == "method_override_refused" and "which one is a guess" in answer.json()["detail"]
    assert arrived(over, bucket) == [] and receipts_of(over_proxy, bucket) == []
    plain = over_clients.send("requests", "POST", over.url + path, {"title": "read?"})  # the write it may mean
    assert plain.status == 201 and plain.headers.get("x-receipt-id") and "x-receipt-replayed" not in plain.headers
    assert over.commits(path) == 1
