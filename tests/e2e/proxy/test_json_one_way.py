"""
JSON is read one way (issue 24, items 5, 10 and 11), through a real mitmdump, with the effect
counted upstream.

- Upstreams that read JSON as Node and as Go servers do (tests/lenient_json.py), behind an MCP
  rule and a GraphQL rule: a body with an invalid UTF-8 byte, or keys spelled in another case
  (`"Method": "tools/call"`; `"method": "tools/list", "METHOD": "tools/call"`; `"Query"`), is
  "not a write" to a proxy that reads it strictly as Python does, so it passed untouched and
  ran twice with no receipt. Now it is refused: 400 (a JSON-RPC error for MCP), nothing sent,
  counted as `bad_json` in receipt_proxy_refused_total; the same call well formed still runs
  once and its retry is replayed.
- tests/upstream.py behind the shared test rules: a key twice in a JSON body is refused (400,
  the key and the object it is in named); `1` and `1.0`, `100` and `1e2` are one intent, `1e400`
  and `2e400` two; the same title in UTF-8 and in Latin-1 (`charset=latin-1`, JSON or form) is
  one intent.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from proxy_addon.store import Store
from tests.conftest import wait_for
from tests.e2e.processes import METRICS_URL, Clients, Proxy
from tests.lenient_json import LenientServer
from tests.mitm.test_metrics_server import by, scrape

RULES = """\
api: lenient
hosts: ["127.0.0.1"]
operations:
  issues.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
    fingerprint: {body: [params.arguments.title]}
  issues.mutate:
    match: {method: POST, path: /graphql, graphql: issueCreate}
    fingerprint: {body: [input.title]}
"""
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def lenient_proxy(tmp_path_factory, confdir):
    workdir = tmp_path_factory.mktemp("lenient")
    rules = workdir / "rules"
    rules.mkdir()
    (rules / "lenient.yaml").write_text(RULES)
    p = Proxy(workdir, confdir, rules=rules, extra=("--set", "receipts_metrics=127.0.0.1:0")).start()
    try:
        p.metrics_url = wait_for(lambda: METRICS_URL.search(p.log()), what="the metrics URL").group(1)
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module", params=["node", "go"])
def server(request):
    with LenientServer(request.param) as up:
        yield up


def post(proxy: Proxy, url: str, body: bytes) -> httpx.Response:
    with httpx.Client(proxy=proxy.url, trust_env=False, timeout=15) as client:
        return client.post(url, content=body, headers=ACCEPT)


def receipts(proxy: Proxy, marker: str) -> list:
    store = Store.open(proxy.db, create=False)
    try:
        return [r for r in store.list(limit=None) if marker in json.dumps(r.intent, ensure_ascii=False)]
    finally:
        store.close()


def refused_bad_json(proxy: Proxy, operation: str) -> float:
    return by(scrape(proxy.metrics_url)[1], "receipt_proxy_refused_total", "operation", "reason").get(
        (operation, "bad_json"), 0.0
    )


def tool_call(title: str, *, id_: int = 1) -> bytes:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": id_,
            "method": "tools/call",
            "params": {"name": "create_issue", "arguments": {"title": title}},
        }
    ).encode()


MUTATION = "mutation($t: String) { issueCreate(input: {title: $t}) { id } }"


def mutation(title: str) -> bytes:
    return json.dumps({"query": MUTATION, "variables": {"t": title}}).encode()


def refused_twice(proxy: Proxy, server: LenientServer, path: str, body: bytes) -> list[httpx.Response]:
    """The body sent, then sent again (an agent's retry): both answered by the proxy, neither run."""
    answers = [post(proxy, server.url + path, body) for _ in range(2)]
    assert server.runs() == [], "the server ran a request the proxy could not read (two effects, no receipt)"
    for a in answers:
        assert a.status_code == 400, a.text
    return answers


def runs_once(proxy: Proxy, server: LenientServer, path: str, body: bytes, title: str) -> None:
    """The same request well formed: run once with a receipt, its retry replayed."""
    first, retry = post(proxy, server.url + path, body), post(proxy, server.url + path, body)
    assert first.status_code == retry.status_code == 200, (first.text, retry.text)
    assert retry.headers.get("x-receipt-replayed") == "true"
    assert len(server.runs()) == 1
    assert [r.state for r in receipts(proxy, title)] == ["succeeded"]


def test_an_mcp_call_with_invalid_utf8_is_refused(lenient_proxy, server):
    """Node and Go replace the byte with U+FFFD and run the call; before, the proxy saw no JSON and passed it."""
    server.reset()
    title = f"caf\xe9 {uuid.uuid4().hex[:8]}"
    bad = tool_call(title).replace(json.dumps(title)[1:-1].encode(), title.encode("latin-1"))  # é: one Latin-1 byte
    assert b"\xe9" in bad
    before = refused_bad_json(lenient_proxy, "issues.create")
    for a in refused_twice(lenient_proxy, server, "/mcp", bad):
        error = a.json()["error"]
        assert a.json()["id"] == 1 and error["code"] == -32600  # the client's own id, in its framing
        assert "not UTF-8 (byte 0xe9 at offset" in error["message"]
    assert receipts(lenient_proxy, title[4:]) == []
    assert refused_bad_json(lenient_proxy, "issues.create") == before + 2
    runs_once(lenient_proxy, server, "/mcp", tool_call(title), title)


def test_a_graphql_mutation_with_invalid_utf8_is_refused(lenient_proxy, server):
    server.reset()
    title = f"caf\xe9 {uuid.uuid4().hex[:8]}"
    bad = mutation(title).replace(json.dumps(title)[1:-1].encode(), title.encode("latin-1"))
    assert b"\xe9" in bad
    for a in refused_twice(lenient_proxy, server, "/graphql", bad):
        assert a.json()["error"] == "bad_json" and a.json()["sent"] is False
        assert "the GraphQL request body is not UTF-8" in a.json()["detail"]
    assert receipts(lenient_proxy, title[4:]) == []
    runs_once(lenient_proxy, server, "/graphql", mutation(title), title)


CASE_FOLDED = {
    "Method": ("/mcp", lambda t: tool_call(t).replace(b'"method"', b'"Method"'), "reads as 'method'"),
    "method and METHOD": (
        "/mcp",
        lambda t: tool_call(t).replace(b'"method": "tools/call"', b'"method": "tools/list", "METHOD": "tools/call"'),
        "differ only by case",
    ),
    "name and NAME": (
        "/mcp",
        lambda t: tool_call(t).replace(b'"name": "create_issue"', b'"name": "list_issues", "NAME": "create_issue"'),
        "differ only by case",
    ),
    "Title": ("/mcp", lambda t: tool_call(t).replace(b'"title"', b'"Title"'), "reads as the argument 'title'"),
    "Query": ("/graphql", lambda t: mutation(t).replace(b'"query"', b'"Query"'), "reads as 'query'"),
    "query and QUERY": (
        "/graphql",
        lambda t: mutation(t).replace(b'{"query": ', b'{"query": "query { viewer { id } }", "QUERY": '),
        "differ only by case",
    ),
}


@pytest.mark.parametrize("case", list(CASE_FOLDED))
def test_keys_that_differ_only_by_case_are_refused(lenient_proxy, case):
    """
    Go's encoding/json fills a struct field from a key in any case, the last one winning: these
    bodies ran create_issue / issueCreate on a Go server while the proxy saw no call, or a read
    (or, for `Title`, a call without the title the rule names: its retry with another title got
    the first one's replay).
    """
    path, spell, says = CASE_FOLDED[case]
    with LenientServer("go") as go:
        title = f"folded {uuid.uuid4().hex[:8]}"
        answers = refused_twice(lenient_proxy, go, path, spell(title))
        text = json.dumps([a.json() for a in answers])
        assert says in text and "regardless of case" in text
        assert receipts(lenient_proxy, title) == []
        runs_once(lenient_proxy, go, path, (tool_call if path == "/mcp" else mutation)(title), title)


def test_a_key_twice_in_a_json_body_is_refused(proxy, upstream, bucket):
    """Python (and Node) keep the last `title`, an API that keeps the first sees another write: 400, never sent."""
    clients = Clients(proxy)
    things, objects = f"/api/{bucket}/things", f"/api/{bucket}/objects"
    top = clients.send("httpx", "POST", upstream.url + things, b'{"title": "v-one-7f3", "title": "v-two-9c1"}')
    nested = clients.send(
        "requests", "POST", upstream.url + objects, b'{"title": "t", "nested": {"items": [{"sku": "A", "sku": "B"}]}}'
    )
    assert (top.status, nested.status) == (400, 400), (top, nested)
    assert top.json()["error"] == "bad_json" and top.json()["sent"] is False
    assert top.json()["detail"].startswith("the JSON body has the key 'title' twice in the object at the top level")
    assert "the key 'sku' twice in the object at nested.items.0" in nested.json()["detail"]
    assert "v-one" not in top.json()["detail"] and "v-two" not in top.json()["detail"]  # names, never values
    assert upstream.commits(things) == upstream.commits(objects) == 0
    ok = clients.send("curl", "POST", upstream.url + things, b'{"title": "first"}')
    assert ok.status == 201 and upstream.commits(things) == 1


def settled(proxy: Proxy, path: str) -> list:
    def done():
        store = Store.open(proxy.db, create=False)
        try:
            found = [r for r in store.list(limit=None) if path in r.target]
        finally:
            store.close()
        return found if found and all(r.state not in ("submitted",) for r in found) else None

    return wait_for(done, what=f"the receipts of {path}")


@pytest.mark.parametrize(
    "first, second, writes",
    [
        (b"1", b"1.0", 1),
        (b"100", b"1e2", 1),
        (b"1e400", b"2e400", 2),  # both the double inf: before, the second got the first's replay
        (b"0.1", b"0.1000000000000000000001", 2),  # both the double 0.1
    ],
    ids=["1-1.0", "100-1e2", "1e400-2e400", "0.1-0.1000000000000000000001"],
)
def test_numbers_are_one_intent_by_value(proxy, upstream, bucket, first, second, writes):
    clients = Clients(proxy)
    path = f"/api/{bucket}/payments"
    a = clients.send("httpx", "POST", upstream.url + path, b'{"customer": "c1", "amount": ' + first + b"}")
    b = clients.send("requests", "POST", upstream.url + path, b'{"customer": "c1", "amount": ' + second + b"}")
    assert (a.status, b.status) == (201, 201), (a, b)
    assert upstream.commits(path) == writes
    assert (b.headers.get("x-receipt-replayed") == "true") == (writes == 1)
    assert len(settled(proxy, path)) == writes


def test_the_declared_charset_is_read(proxy, upstream, bucket):
    """The same title sent as UTF-8 and as Latin-1 (declared), as JSON and as a form: one intent each."""
    clients = Clients(proxy)
    title = f"Tasse à café {bucket}"
    json_path, form_path = f"/api/{bucket}/things", f"/api/{bucket}x/things"
    latin1 = {"Content-Type": "application/json; charset=latin-1"}
    utf8 = clients.send(
        "httpx", "POST", upstream.url + json_path, json.dumps({"title": title}, ensure_ascii=False).encode()
    )
    declared = clients.send(
        "requests",
        "POST",
        upstream.url + json_path,
        json.dumps({"title": title}, ensure_ascii=False).encode("latin-1"),
        headers=latin1,
    )
    assert (utf8.status, declared.status) == (201, 201)
    assert declared.headers.get("x-receipt-replayed") == "true", "before: the Latin-1 body was another intent"
    assert upstream.commits(json_path) == 1
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    form_latin1 = {"Content-Type": "application/x-www-form-urlencoded; charset=ISO-8859-1"}
    from urllib.parse import quote

    a = clients.send("curl", "POST", upstream.url + form_path, f"title={quote(title)}".encode(), headers=form)
    b = clients.send(
        "httpx",
        "POST",
        upstream.url + form_path,
        f"title={quote(title, encoding='latin-1')}".encode(),
        headers=form_latin1,
    )
    assert (a.status, b.status) == (201, 201)
    assert b.headers.get("x-receipt-replayed") == "true", "before: %E9 was read as U+FFFD, another intent"
    assert upstream.commits(form_path) == 1
    (r,) = settled(proxy, form_path)
    assert r.intent["form"] == {"title": title}
