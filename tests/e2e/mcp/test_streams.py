"""
An MCP tool call answered with an event stream (Streamable HTTP, `text/event-stream`) is passed on
as it comes and classified from the response that carries the call's id, as soon as it arrives
(issue 24, "Wrong answers"). Real parts: a mitmdump with the receipts addon, the hand-made
endpoint of tests/e2e/mcp/sse_upstream.py (shapes the SDK's server cannot make), and a raw client
(httpx) reading the stream through the proxy, one event at a time.

- 100,000 notifications, then the result: succeeded, the client gets every notification and the
  result, the receipt records the result's event alone, and the proxy's memory stays bounded
  (before: `outcome_unknown`, the stream held whole).
- The result, then a stream that never ends: succeeded as soon as the result arrived, while the
  stream goes on; a retry is replayed; once the client has gone, the proxy closes the upstream
  connection (before: nothing reached the client until receipts_upstream_timeout, then
  `outcome_unknown`).
- The result, then the stream breaks: succeeded; the client's stream is cut as the upstream's was.
- A notification sent before a slow result reaches the client before the result: the test lets
  the endpoint send its result only once the client has the notification (before: held until
  the result, so the endpoint waited in vain).
- A result that outlives receipts_upstream_timeout: the notification reaches the client at once;
  at the deadline the receipt is `outcome_unknown` and the stream ends with the proxy's words.
- A stream the drain cuts (SIGTERM, receipts_drain_timeout passed) before its result is
  `outcome_unknown`, and the client's stream ends with the proxy's words, as one more event.
- The SDK's own server (SSE mode, https) and client: a result, its replay and a lost answer, the
  two answers streamed by mitmproxy, and the receipt holding the response's event alone. (The
  SDK's tests in tests/e2e/mcp/test_mcp.py, SSE mode, go through the same path.)
- A response with another id on the call's stream (issue 25): passed on, and the call waits for
  its own, which decides (the endpoint sends it only once the client has the other one); a
  stream that ends with the other response alone is `outcome_unknown`, although the SDK's client
  takes that response as its result, and the retry is blocked.
- The SDK's client (2025-11-25) on the hand-made shapes: a result the stream outlives, or breaks
  after, is its result, succeeded, and a retry replayed; a result that never comes before
  receipts_upstream_timeout is the proxy's isError words, `outcome_unknown`, the retry blocked.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import recorded_answer, wait_for
from tests.e2e.mcp.sse_upstream import SseUpstream
from tests.e2e.mcp.test_mcp import receipts
from tests.e2e.processes import Proxy
from tests.e2e.proxy.test_memory import vm

MiB = 1024 * 1024
RULES = """\
api: tracker
hosts: ["127.0.0.1"]
operations:
  issues.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
    fingerprint: {body: [params.arguments.title, params.arguments.shape]}
    external_id: number
"""
SDK_RULES = """\
api: tracker
hosts: ["127.0.0.1"]
operations:
  issues.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
    fingerprint: {body: [params.arguments.title, params.arguments.body]}
    external_id: number
"""
ACCEPT = "application/json, text/event-stream"


@pytest.fixture(scope="module")
def upstream() -> Iterator[SseUpstream]:
    with SseUpstream() as up:
        yield up


@pytest.fixture
def proxy(tmp_path: Path, confdir: Path) -> Iterator[Proxy]:
    """A mitmdump of this test's own (its memory is this test's alone); the upstream timeout well past any shape."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "tracker.yaml").write_text(RULES)
    p = Proxy(tmp_path, confdir, rules=rules, extra=("--set", "receipts_upstream_timeout=20"))
    try:
        yield p.start()
    finally:
        p.stop()


def tool_call(rid: int, args: dict) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": "create_issue", "arguments": args}}


def events(response: httpx.Response) -> Iterator[dict]:
    """The JSON-RPC messages of an event stream, each as soon as its event has ended (comments skipped)."""
    data: list[str] = []
    for line in response.iter_lines():
        if line:
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value.removeprefix(" "))
            continue
        if data:
            yield json.loads("\n".join(data))
        data = []


def client(proxy: Proxy, timeout: float = 30.0) -> httpx.Client:
    return httpx.Client(proxy=proxy.url, timeout=httpx.Timeout(timeout), trust_env=False)


def the_receipt(proxy: Proxy, title: str):
    found = receipts(proxy, title)
    assert len(found) == 1, found
    return found[0]


def test_a_result_after_100000_notifications_is_succeeded_and_memory_stays_bounded(upstream, proxy):
    n = 100_000
    with client(proxy) as c:
        warm = {"title": f"warm {uuid.uuid4().hex[:8]}"}
        with c.stream("POST", upstream.url, json=tool_call(1, warm), headers={"Accept": ACCEPT}) as r:
            assert [m.get("id") for m in events(r)] == [1]
        before = vm(proxy.proc.pid)["VmRSS"]
        args: dict[str, Any] = {"title": f"flood {uuid.uuid4().hex[:8]}", "shape": "flood", "n": n, "size": 300}
        notifications, size = 0, 0
        results: list[dict] = []
        with c.stream("POST", upstream.url, json=tool_call(2, args), headers={"Accept": ACCEPT}) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
            for message in events(r):
                if message.get("method") == "notifications/progress":
                    assert not results, "a notification after the result"
                    assert message["params"]["progress"] == notifications  # in order, none lost
                    notifications += 1
                else:
                    results.append(message)
            size = r.num_bytes_downloaded
    grown = vm(proxy.proc.pid)["VmHWM"] - before
    print(f"\n{n} notifications, {size / MiB:.0f} MiB through the proxy: its peak RSS grew by {grown} MiB")
    assert notifications == n and size > 30 * MiB
    assert (
        len(results) == 1
        and results[0]["id"] == 2
        and results[0]["result"]["structuredContent"]["title"] == args["title"]
    )
    receipt = the_receipt(proxy, args["title"])
    assert receipt.state == "succeeded", (receipt.state, receipt.error)
    assert receipt.external_id == str(results[0]["result"]["structuredContent"]["number"])
    recorded = recorded_answer(proxy.db, receipt).body
    assert b'"result"' in recorded and b"notifications/progress" not in recorded and len(recorded) < 1000
    # Held whole, the stream would take its size once and again (the body, then its copy): bounded, it takes neither.
    assert grown < 20, f"the proxy's peak RSS grew by {grown} MiB for a {size / MiB:.0f} MiB stream"
    assert upstream.created >= 2


def test_a_result_then_a_stream_that_never_ends_is_succeeded_at_the_result(upstream, proxy):
    args = {"title": f"endless {uuid.uuid4().hex[:8]}", "shape": "endless"}
    try:
        with client(proxy, timeout=15) as c:
            with c.stream("POST", upstream.url, json=tool_call(7, args), headers={"Accept": ACCEPT}) as r:
                assert r.status_code == 200
                stream = events(r)
                first = next(stream)
                assert first["id"] == 7 and first["result"]["structuredContent"]["title"] == args["title"]
                # While the stream goes on (pings keep coming), the receipt says succeeded.
                receipt = wait_for(
                    lambda: next((x for x in receipts(proxy, args["title"]) if x.state == "succeeded"), None),
                    timeout=20,
                    what="the receipt to be succeeded while the stream goes on",
                )
                assert receipt.external_id == str(first["result"]["structuredContent"]["number"])
                pings = upstream.pings[args["title"]]
                wait_for(lambda: upstream.pings[args["title"]] > pings + 2, timeout=20, what="more pings")
                assert not upstream.peer_closed[args["title"]].is_set()
            # The client has gone (httpx closed the connection): the proxy closes the upstream's.
            assert upstream.peer_closed[args["title"]].wait(20), "the upstream stream was left open"
            retry = c.post(upstream.url, json=tool_call(8, args), headers={"Accept": ACCEPT})
        assert retry.status_code == 200 and retry.headers.get("x-receipt-replayed") == "true"
        replayed = list(events_of(retry))
        assert [m["id"] for m in replayed] == [8]
        assert replayed[0]["result"]["structuredContent"] == first["result"]["structuredContent"]
        assert [m["params"]["arguments"] for m in upstream.calls].count(args) == 1, "the retry was sent"
        assert the_receipt(proxy, args["title"]).state == "succeeded"
    finally:
        upstream.release(args["title"])  # nothing held; the stream itself ends when its client has gone


def test_a_stream_that_breaks_after_its_result_leaves_it_succeeded(upstream, proxy):
    args = {"title": f"broken {uuid.uuid4().hex[:8]}", "shape": "broken"}
    with client(proxy) as c:
        with c.stream("POST", upstream.url, json=tool_call(11, args), headers={"Accept": ACCEPT}) as r:
            stream = events(r)
            result = next(stream)
            assert result["id"] == 11 and result["result"]["structuredContent"]["title"] == args["title"]
            with pytest.raises(httpx.RemoteProtocolError):  # the break is passed on: the stream is cut, not ended
                list(stream)
        retry = c.post(upstream.url, json=tool_call(12, args), headers={"Accept": ACCEPT})
    assert [m["result"]["structuredContent"] for m in events_of(retry)] == [result["result"]["structuredContent"]]
    assert retry.headers.get("x-receipt-replayed") == "true"
    receipt = the_receipt(proxy, args["title"])
    assert receipt.state == "succeeded", (receipt.state, receipt.error)
    assert [m["params"]["arguments"] for m in upstream.calls].count(args) == 1


def test_a_notification_reaches_the_client_before_a_slow_result(upstream, proxy):
    args = {"title": f"held {uuid.uuid4().hex[:8]}", "shape": "held"}
    try:
        with (
            client(proxy) as c,
            c.stream("POST", upstream.url, json=tool_call(3, args), headers={"Accept": ACCEPT}) as r,
        ):
            stream = events(r)
            first = next(stream)
            assert first.get("method") == "notifications/message", first
            assert the_receipt(proxy, args["title"]).state == "submitted"  # no result yet
            upstream.release(args["title"])  # the result is sent only now that the client has the notification
            result = next(stream)
        assert result["id"] == 3 and result["result"]["structuredContent"]["released"] is True
        assert wait_for(
            lambda: the_receipt(proxy, args["title"]).state == "succeeded",
            timeout=20,
            what="the receipt to be succeeded",
        )
    finally:
        upstream.release(args["title"])


def events_of(response: httpx.Response) -> Iterator[dict]:
    """The JSON-RPC messages of a whole answer: an event stream's, or one JSON body."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        text = response.text.replace("\r\n", "\n")
        for block in text.split("\n\n"):
            data = [line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")]
            if data:
                yield json.loads("\n".join(data))
    else:
        yield response.json()


def test_a_stream_cut_by_the_drain_before_its_result_is_unknown_and_says_so(upstream, tmp_path, confdir):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "tracker.yaml").write_text(RULES)
    proxy = Proxy(tmp_path, confdir, rules=rules, extra=("--set", "receipts_drain_timeout=1"))
    args = {"title": f"drained {uuid.uuid4().hex[:8]}", "shape": "held"}
    try:
        proxy.start()
        with (
            client(proxy) as c,
            c.stream("POST", upstream.url, json=tool_call(4, args), headers={"Accept": ACCEPT}) as r,
        ):
            stream = events(r)
            assert next(stream).get("method") == "notifications/message"
            proxy.process.send_signal(signal.SIGTERM)  # the result is held: the drain's timeout passes first
            last = list(stream)
        assert proxy.process.wait(timeout=30) == 0
        assert [m["id"] for m in last] == [4]
        said = last[0]["result"]
        assert said["isError"] is True and "answer was lost" in said["content"][0]["text"]
        receipt = the_receipt(proxy, args["title"])
        assert receipt.state == "outcome_unknown" and "receipts_drain_timeout" in (receipt.error or "")
        assert said["content"][0]["text"].count(receipt.operation_id) == 1
    finally:
        upstream.release(args["title"])
        proxy.stop()


def test_the_sdk_over_https_gets_its_event_streams_through_the_relay(tmp_path, confdir):
    """The SDK's server (SSE mode, https) and client: results, a replay and a lost answer, each streamed."""
    from tests.e2e.mcp.client import run_client
    from tests.e2e.mcp.fixtures import McpServer

    with McpServer("sse", tmp_path, tls=True) as server:
        rules = tmp_path / "rules"
        rules.mkdir()
        (rules / "tracker.yaml").write_text(SDK_RULES)
        proxy = Proxy(tmp_path, confdir, rules=rules, upstream_ca=server.cert_path)
        try:
            proxy.start()
            args, lost = {"title": f"tls {uuid.uuid4().hex[:8]}"}, {"title": f"tls lost {uuid.uuid4().hex[:8]}"}
            server.queue("commit_then_drop")
            report = run_client(
                server.url,
                [("call", "create_issue", lost), ("call", "create_issue", args), ("call", "create_issue", args)],
                revision="2026-07-28",
                proxy=proxy.url,
                ca=proxy.ca,
                timeout=10,
            )
            dropped, first, retry = report["results"]
            assert dropped["ok"] and dropped["is_error"] and "answer was lost" in dropped["content"][0]["text"]
            assert first["ok"] and not first["is_error"] and first["structured"]["title"] == args["title"]
            assert retry["ok"] and retry["structured"] == first["structured"]
            assert [h["content_type"] for h in report["http"] if h["jsonrpc_method"] == "tools/call"][:2] == [
                "text/event-stream",
                "text/event-stream",
            ]
            assert server.effects()["created"] == 2
            receipt = the_receipt(proxy, args["title"])
            assert receipt.state == "succeeded" and receipt.external_id == str(first["structured"]["number"])
            # The response's event alone is recorded, not the `: ping` comments the SDK's server sent before it.
            recorded = recorded_answer(proxy.db, receipt).body
            assert recorded.count(b"data:") == 1 and b"ping" not in recorded
            assert the_receipt(proxy, lost["title"]).state == "outcome_unknown"
            assert proxy.log().count("Streaming response from") == 2  # mitmproxy's word: the two answers streamed
        finally:
            proxy.stop()


def test_a_stream_whose_result_outlives_the_upstream_timeout_is_unknown_and_says_so(upstream, tmp_path, confdir):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "tracker.yaml").write_text(RULES)
    proxy = Proxy(tmp_path, confdir, rules=rules, extra=("--set", "receipts_upstream_timeout=2"))
    args = {"title": f"late {uuid.uuid4().hex[:8]}", "shape": "held"}
    try:
        proxy.start()
        with (
            client(proxy) as c,
            c.stream("POST", upstream.url, json=tool_call(5, args), headers={"Accept": ACCEPT}) as r,
        ):
            got = list(events(r))  # the notification at once; then, at the deadline, the proxy's words
        assert [m.get("method") for m in got] == ["notifications/message", None]
        said = got[1]
        assert said["id"] == 5 and said["result"]["isError"] is True
        receipt = the_receipt(proxy, args["title"])
        assert receipt.state == "outcome_unknown" and receipt.operation_id in said["result"]["content"][0]["text"]
        assert "answer was lost" in said["result"]["content"][0]["text"]
        assert "receipts_upstream_timeout (2s)" in (receipt.error or "")
    finally:
        upstream.release(args["title"])
        proxy.stop()


def test_a_response_with_another_id_is_passed_on_and_the_call_waits_for_its_own(upstream, proxy):
    """Another id (here "21" for 21: two types, two ids) answers another request: passed on, never the call's
    outcome."""
    args = {"title": f"other {uuid.uuid4().hex[:8]}", "shape": "other"}
    try:
        with client(proxy) as c:
            with c.stream("POST", upstream.url, json=tool_call(21, args), headers={"Accept": ACCEPT}) as r:
                stream = events(r)
                other = next(stream)
                assert other["id"] == "21" and other["result"]["content"][0]["text"] == "an answer to another request"
                assert the_receipt(proxy, args["title"]).state == "submitted"  # not the call's: still waiting
                upstream.release(args["title"])  # the call's result comes only once the client has the other one
                result = next(stream)
                assert list(stream) == []
            retry = c.post(upstream.url, json=tool_call(22, args), headers={"Accept": ACCEPT})
        assert result["id"] == 21 and result["result"]["structuredContent"]["released"] is True
        receipt = wait_for(
            lambda: next((x for x in receipts(proxy, args["title"]) if x.state == "succeeded"), None),
            timeout=20,
            what="the receipt to be succeeded",
        )
        assert receipt.external_id == str(result["result"]["structuredContent"]["number"])
        recorded = recorded_answer(proxy.db, receipt).body
        assert recorded.count(b"data:") == 1 and b"another request" not in recorded
        assert retry.headers.get("x-receipt-replayed") == "true"
        assert [(m["id"], m["result"]["structuredContent"]) for m in events_of(retry)] == [
            (22, result["result"]["structuredContent"])
        ]
        assert [m["params"]["arguments"] for m in upstream.calls].count(args) == 1
    finally:
        upstream.release(args["title"])


def sdk_call(upstream: SseUpstream, proxy: Proxy, *ops: tuple, timeout: float = 5.0) -> dict:
    """The official SDK's client (2025-11-25) through the proxy to the hand-made endpoint."""
    from tests.e2e.mcp.client import run_client

    report = run_client(upstream.url, list(ops), revision="legacy", proxy=proxy.url, timeout=timeout)
    assert "connect_error" not in report and report["protocol_version"] == "2025-11-25", report
    return report


def test_a_stream_that_ends_with_another_ids_response_alone_is_unknown(upstream, proxy):
    """
    The SDK's client takes the first response on a call's stream whatever its id (it puts the
    request's id in): the agent reads "an answer to another request" as its result. The proxy
    records the server's answer to the call, which never came: outcome_unknown, and the retry
    is blocked, not sent.
    """
    args = {"title": f"other alone {uuid.uuid4().hex[:8]}", "shape": "other", "then": "end"}
    first, retry = sdk_call(upstream, proxy, ("call", "create_issue", args), ("call", "create_issue", args))["results"]
    assert first["ok"] and first["content"][0]["text"] == "an answer to another request", first
    receipt = the_receipt(proxy, args["title"])
    assert receipt.state == "outcome_unknown", (receipt.state, receipt.error)
    assert "without a JSON-RPC response to the call" in (receipt.error or "")
    assert retry["ok"] and retry["is_error"] and retry["content"][0]["text"].startswith("NOT SENT")
    assert receipt.operation_id in retry["content"][0]["text"]
    assert [m["params"]["arguments"] for m in upstream.calls].count(args) == 1


@pytest.mark.parametrize("shape", ["endless", "broken"])
def test_the_sdk_client_gets_a_result_that_a_stream_outlives_or_breaks_after(upstream, proxy, shape):
    """The SDK's client reads up to the result and closes the stream; the receipt is succeeded; a retry replayed."""
    args = {"title": f"sdk {shape} {uuid.uuid4().hex[:8]}", "shape": shape}
    first, retry = sdk_call(upstream, proxy, ("call", "create_issue", args), ("call", "create_issue", args))["results"]
    assert first["ok"] and not first["is_error"], first
    assert first["structured"]["title"] == args["title"]
    assert retry["ok"] and not retry["is_error"] and retry["structured"] == first["structured"], retry
    receipt = the_receipt(proxy, args["title"])
    assert receipt.state == "succeeded" and receipt.external_id == str(first["structured"]["number"])
    assert [m["params"]["arguments"] for m in upstream.calls].count(args) == 1
    if shape == "endless":  # the client has gone: the proxy closed the upstream's stream
        assert upstream.peer_closed[args["title"]].wait(20), "the upstream stream was left open"


def test_the_sdk_client_gets_the_proxys_words_when_no_result_comes_in_time(upstream, tmp_path, confdir):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "tracker.yaml").write_text(RULES)
    proxy = Proxy(tmp_path, confdir, rules=rules, extra=("--set", "receipts_upstream_timeout=2"))
    args = {"title": f"sdk late {uuid.uuid4().hex[:8]}", "shape": "held"}
    try:
        proxy.start()
        report = sdk_call(upstream, proxy, ("call", "create_issue", args), ("call", "create_issue", args), timeout=10)
        first, retry = report["results"]
        receipt = the_receipt(proxy, args["title"])
        assert receipt.state == "outcome_unknown" and "receipts_upstream_timeout (2s)" in (receipt.error or "")
        assert first["ok"] and first["is_error"] and "answer was lost" in first["content"][0]["text"], first
        assert receipt.operation_id in first["content"][0]["text"]
        assert retry["ok"] and retry["is_error"] and retry["content"][0]["text"].startswith("NOT SENT"), retry
        assert [m["params"]["arguments"] for m in upstream.calls].count(args) == 1
    finally:
        upstream.release(args["title"])
        proxy.stop()
