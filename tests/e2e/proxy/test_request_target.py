"""
Which requests a rule's host and path match, at the edges (issue 24, items 9 and 12), through a
real mitmdump to real upstreams that count their effects:

- a fragment in the request target (`POST http://host/api/b/things#x`): RFC 9110 says it is
  never sent, but a client can send it. A real Flask app (tests/upstream.py FlaskUpstream) drops
  it and creates the object, while the rules saw `/api/b/things%23x`, which nothing matched: two
  objects, no receipt. uvicorn and Go's net/http keep it in the path instead. Now a target whose
  fragment-less reading is a write is refused (400 `ambiguous_request_target`), nothing sent;
- path parameters (`;jsessionid=1`): Tomcat, Jetty and Spring remove them from every segment
  before routing (ServletUpstream), Werkzeug, Starlette, Express and nginx keep them. A target
  with them that either reading makes a write is refused the same way; `%3B` is no separator to
  any of them and is matched as before;
- loopback names: a write to `localhost` (or `::1`) under a rule that names `127.0.0.1` passed
  through with no receipt, and HTTPS to it was tunnelled untouched. Now they are aliases: a
  receipt, one intent with the write sent to `127.0.0.1`, the retry blocked. A request to the
  host the rule names keeps the fingerprint it always had (pinned in tests/rules/test_ruleset.py,
  with the matching itself).

Raw requests go out on a socket (`send`): no HTTP client sends a fragment.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest

from tests.conftest import RECORDED_TOKEN, SECRETS
from tests.e2e.processes import Proxy
from tests.e2e.proxy.test_integration import receipts_for
from tests.e2e.proxy.test_local_refusals import Reply, exchange_raw
from tests.rules.test_ruleset import RULES
from tests.upstream import FlaskUpstream, ServletUpstream


@pytest.fixture(scope="module")
def flask_up():
    with FlaskUpstream() as up:
        yield up


@pytest.fixture(scope="module")
def servlet():
    with ServletUpstream() as up:
        yield up


@pytest.fixture(scope="module")
def target_proxy(tmp_path_factory, confdir):
    work = tmp_path_factory.mktemp("target-proxy")
    rules = work / "rules"
    rules.mkdir()
    (rules / "target.yaml").write_text(RULES)
    p = Proxy(work, confdir, rules=rules).start()
    yield p
    p.stop()


def send(proxy: Proxy, url: str, title: str) -> Reply:
    """`POST url` with the absolute URL as the request target, byte for byte (a fragment too), on its own connection."""
    body = json.dumps({"title": title}).encode()
    head = (
        f"POST {url} HTTP/1.1\r\nHost: {urlsplit(url).netloc}\r\napi-key: {SECRETS['api-key']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return exchange_raw(proxy.port, head + body)


def assert_refused(reply: Reply, what: str) -> None:
    assert reply.status == 400, reply
    doc = reply.json()
    assert (doc["error"], doc["sent"], doc["operation"]) == ("ambiguous_request_target", False, "things.create")
    assert what in doc["detail"], doc
    assert "x-receipt-id" not in reply.headers


def test_a_fragment_after_a_write_is_refused_and_flask_makes_one_object(target_proxy, flask_up, bucket):
    """Issue 24 item 9: Flask dropped the fragment and created a second object, with no receipt for it."""
    path = f"/api/{bucket}/things"
    first = send(target_proxy, f"{flask_up.url}{path}", "one")
    assert first.status == 201 and first.headers["x-receipt-state"] == "succeeded", first

    retry = send(target_proxy, f"{flask_up.url}{path}#x", "one")
    assert_refused(retry, "a fragment (#…)")
    assert flask_up.created(bucket) == 1, "the retry with a fragment must not reach Flask"
    assert [t for t in flask_up.targets if bucket in t] == [path]
    # Every write that was sent has its receipt.
    assert [r.state for r in receipts_for(target_proxy, bucket)] == ["succeeded"]


def test_a_fragment_alone_is_refused_before_any_receipt(target_proxy, flask_up, bucket):
    path = f"/api/{bucket}/things"
    for _ in range(2):
        assert_refused(send(target_proxy, f"{flask_up.url}{path}#frag", "two"), "never sent")
    assert_refused(send(target_proxy, f"{flask_up.url}{path}?draft=1#frag", "two"), "a fragment")
    assert flask_up.created(bucket) == 0
    assert receipts_for(target_proxy, bucket) == []
    # The same write without the fragment is a first write.
    ok = send(target_proxy, f"{flask_up.url}{path}", "two")
    assert ok.status == 201 and ok.headers["x-receipt-state"] == "succeeded" and flask_up.created(bucket) == 1


def test_a_fragment_on_a_path_no_rule_matches_passes_untouched(target_proxy, flask_up, bucket):
    """Neither reading is a write: none of the rules' business, passed to Flask (which has no such route)."""
    reply = send(target_proxy, f"{flask_up.url}/api/{bucket}/elsewhere#x", "three")
    assert reply.status == 404 and "x-receipt-id" not in reply.headers, reply
    assert receipts_for(target_proxy, bucket) == []


SPELLINGS = [
    pytest.param("/api/{b}/things;jsessionid=1", id="jsessionid-last-segment"),
    pytest.param("/api/{b};jsessionid=1/things", id="in-a-parameter-segment"),
    pytest.param("/api/{b}/x/..;/things", id="dot-dot-semicolon"),
    pytest.param("/api/{b}/things;", id="bare-semicolon"),
    pytest.param("/api/{b}/things;v=1#x", id="with-a-fragment"),
]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_path_parameters_after_a_write_are_refused_and_a_servlet_sees_one_write(
    target_proxy, servlet, bucket, spelling
):
    path = f"/api/{bucket}/things"
    first = send(target_proxy, f"{servlet.url}{path}", "four")
    assert first.status == 201 and first.headers["x-receipt-state"] == "succeeded", first

    retry = send(target_proxy, servlet.url + spelling.format(b=bucket), "four")
    assert_refused(retry, "path parameters (;…)" if ";" in spelling.partition("#")[0] else "fragment")
    assert servlet.seen(path) == 1, "a servlet container routes the retry to the same write"
    assert [r.state for r in receipts_for(target_proxy, bucket)] == ["succeeded"]


def test_an_encoded_semicolon_is_data_and_matched_as_before(target_proxy, servlet, bucket):
    """`%3B` separates nothing for any server: the write is matched, with `b;x` as its bucket, and sent."""
    encoded = f"/api/{bucket}%3Bx/things"
    got = send(target_proxy, servlet.url + encoded, "five")
    assert got.status == 201 and got.headers["x-receipt-state"] == "succeeded", got
    assert servlet.seen(encoded) == 1
    [r] = receipts_for(target_proxy, f"{bucket}%3Bx")
    assert r.intent["path"] == {"bucket": f"{bucket};x"}


def test_path_parameters_on_a_path_no_rule_matches_pass_untouched(target_proxy, servlet, bucket):
    path = f"/api/{bucket}/notes;jsessionid=1"
    got = send(target_proxy, servlet.url + path, "six")
    assert got.status == 201 and "x-receipt-id" not in got.headers, got
    assert servlet.seen(f"/api/{bucket}/notes") == 1


def test_localhost_under_a_rule_naming_127_0_0_1_gets_a_receipt_and_its_retries_are_blocked(clients, upstream, bucket):
    """Issue 24 item 12, with real curl: every loopback name is one intent with the write's, and never sent twice."""
    path = f"/api/{bucket}/plain"
    upstream.plan(path, "drop")
    first = clients.send("curl", "POST", f"http://localhost:{upstream.port}{path}", {"title": "seven"})
    assert first.headers.get("x-receipt-state") == "outcome_unknown", first
    for host in ("localhost", "127.0.0.1", "[::1]", "LocalHost."):
        retry = clients.send("curl", "POST", f"http://{host}:{upstream.port}{path}", {"title": "seven"})
        assert retry.status == 409, (host, retry)
        assert retry.headers["x-receipt-id"] == first.headers["x-receipt-id"], host
    assert upstream.seen(path) == 1
    [r] = receipts_for(clients.proxy, bucket)
    assert r.state == "outcome_unknown" and r.target.startswith(f"http://localhost:{upstream.port}/")


def test_https_to_localhost_is_intercepted_and_replayed(clients, tls_upstream, bucket):
    """Before, `localhost` was no ruled host: its TLS was tunnelled, and its writes passed with no receipt."""
    path = f"/api/{bucket}/plain"
    url = f"https://localhost:{tls_upstream.port}{path}"
    first = clients.send("curl", "POST", url, {"title": "eight"})
    assert first.status == 201 and first.headers.get("x-receipt-state") == "succeeded", first
    again = clients.send("curl", "POST", url, {"title": "eight"})
    assert again.status == 201 and again.headers.get("x-receipt-replayed") == "true", again
    assert tls_upstream.commits(path) == 1
    if clients.proxy not in RECORDED_TOKEN:
        RECORDED_TOKEN.append(clients.proxy)
