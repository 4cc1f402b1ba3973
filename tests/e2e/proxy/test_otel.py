"""
OpenTelemetry, end to end: a real mitmdump with the otel extra exports its spans over OTLP/HTTP to a
receiver on 127.0.0.1 (tests/e2e/otlp_receiver.py, decoding with opentelemetry-proto), and so does the
`receipts reconcile` CLI; on SQLite and PostgreSQL. The upstream says what it was sent (traceparent).
The marker secrets sweep (tests/conftest.py) reads every export's body (*.otlp) and the JSON log.
Also: an MCP tool call's span (the MCP SDK's server and client), an approval wait's child span, a
takeover after a lease expired (two proxies on PostgreSQL), and the histograms' exemplars.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from tests.conftest import SECRETS, wait_for
from tests.e2e.cli.test_approval_commands import held_id
from tests.e2e.mcp.client import run_client
from tests.e2e.mcp.fixtures import mcp_json_server  # noqa: F401  (the MCP SDK's server, JSON responses)
from tests.e2e.mcp.test_mcp import RULES as MCP_RULES
from tests.e2e.otlp_receiver import OtlpReceiver, Span
from tests.e2e.processes import METRICS_URL, Clients, Proxy, start_all
from tests.e2e.store.test_fleet import (
    FAST_LEASE,
    instance_id,
    only_receipt,
    recovered,
    send_in_background,
    stopped_after_commit,
    woken,
)

pytestmark = pytest.mark.e2e

RECEIPTS = Path(sys.executable).parent / "receipts"
AGENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
AGENT_SPAN = "b7ad6b7169203331"
SERVER, INTERNAL = 2, 1  # OTLP's SpanKind values
ERROR = 2  # OTLP's Status.code for an error


@pytest.fixture
def otlp(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # the proxy's batches leave within 0.1 s, not 5
    with OtlpReceiver(tmp_path) as receiver:
        yield receiver


def start(tmp_path: Path, confdir: Path, db: str, otlp: OtlpReceiver, *extra: str) -> Proxy:
    args = ("--set", f"receipts_otel={otlp.url}", "--set", "receipts_log_format=json", *extra)
    return Proxy(tmp_path, confdir, db=db, extra=args).start()


def start_later(workdir: Path, confdir: Path, db: str, otlp: OtlpReceiver, *extra: str) -> Proxy:
    """A proxy like `start`'s, not started yet (start_all starts several)."""
    return Proxy(workdir, confdir, db=db, extra=("--set", f"receipts_otel={otlp.url}", *extra))


def named(name: str, **attributes) -> object:
    """A span picker: the spans called `name` whose attributes include `attributes`."""
    return lambda spans: [
        s for s in spans if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
    ]


def reconcile_cli(proxy: Proxy, operation_id: str, otlp: OtlpReceiver) -> dict:
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url}
    args = [str(RECEIPTS), "--db", str(proxy.db), "reconcile", operation_id, "--rules", str(proxy.rules)]
    args += ["--header", f"api-key: {SECRETS['api-key']}", "--now", "--json"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    (result,) = json.loads(out.stdout)
    return result


OPENMETRICS = "application/openmetrics-text; version=1.0.0"
EXEMPLAR = re.compile(r'^receipt_proxy_(\w+)_seconds_bucket\{.*\} \S+ # \{trace_id="([0-9a-f]{32})"\}', re.M)


def exemplars(proxy: Proxy, accept: str) -> set[tuple[str, str]]:
    """(histogram, trace id) of every exemplar a scrape of the proxy's metrics with this Accept shows."""
    url = wait_for(lambda: METRICS_URL.search(proxy.log()), timeout=10, what="the metrics URL in the log").group(1)
    got = requests.get(url, headers={"Accept": accept}, timeout=10)
    assert got.status_code == 200
    return set(EXEMPLAR.findall(got.text))


def no_secret_in(spans: list[Span]) -> None:
    text = repr([(s.name, s.attributes, s.events, s.links, s.status_message) for s in spans])
    for name, secret in SECRETS.items():
        assert secret not in text, f"the {name} secret is in a span"


def json_lines(proxy: Proxy) -> list[dict]:
    """The addon's lines of the proxy's log, each parsed: every one must be a JSON object."""
    lines = []
    for line in proxy.log().splitlines():
        if "receipt" in line:  # the addon's lines name the proxy or a receipt; mitmproxy's own do not
            assert line.startswith("{"), f"a text line with receipts_log_format=json: {line}"
            lines.append(json.loads(line))
    return lines


def test_an_unknown_write_its_blocked_retry_and_the_cli_reconcile_are_spans(
    tmp_path, confdir, upstream, bucket, backend_db, otlp
):
    proxy = start(tmp_path, confdir, backend_db, otlp)
    try:
        clients, path = Clients(proxy), f"/api/{bucket}/messages"
        upstream.plan(path, "lost")  # sent, then the connection closes without an answer: outcome_unknown
        first = clients.send("requests", "POST", upstream.url + path, {"title": "traced"})
        assert first.status == 502
        receipt_id = first.headers["x-receipt-id"]
        retry = clients.send("requests", "POST", upstream.url + path, {"title": "traced"})
        assert retry.status == 409 and retry.json()["state"] == "outcome_unknown"  # read once: not yet proof
        name = "POST test-api.messages.create"
        (write,) = otlp.wait_for(named(name, **{"receipt.answer": "forward"}), what="the write's span")
        (dup,) = otlp.wait_for(named(name, **{"receipt.duplicate": "blocked"}), what="the blocked retry's span")
        (read,) = otlp.wait_for(named("receipt.reconcile"), what="the retry's reconcile read")
        sent = [r for r in upstream.requests if r["method"] == "POST" and r["path"].startswith(path)]
        logged = json_lines(proxy)
    finally:
        proxy.stop()

    # The write: a server span of its own trace (the agent sent no traceparent), its receipt, its outcome.
    assert (write.kind, write.parent_span_id, write.status_code) == (SERVER, "", ERROR)
    a = write.attributes
    assert a["receipt.id"] == receipt_id and a["receipt.state"] == "outcome_unknown" and a["receipt.sent"] is True
    assert (a["receipt.api"], a["receipt.operation"]) == ("test-api", "messages.create")
    assert a["http.request.method"] == "POST" and a["http.response.status_code"] == 502
    assert a["receipt.reason"].startswith("outcome unknown") and len(a["receipt.fingerprint"]) == 16
    assert "receipt.upstream_status" not in a  # no answer came
    # The upstream saw the proxy span's context (the one write it got).
    (only,) = sent
    assert only["headers"]["traceparent"].startswith(f"00-{write.trace_id}-{write.span_id}-")  # then its flags

    # The retry: blocked, the receipt it matched, linked to the write's span; its read, a child of it.
    d = dup.attributes
    assert (d["receipt.matched"], d["receipt.id"], d["http.response.status_code"]) == (receipt_id, receipt_id, 409)
    assert "receipt.sent" not in d and dup.trace_id != write.trace_id
    assert [(t, s) for t, s, _ in dup.links] == [(write.trace_id, write.span_id)]
    assert (read.kind, read.trace_id, read.parent_span_id) == (INTERNAL, dup.trace_id, dup.span_id)
    assert read.attributes["receipt.id"] == receipt_id and read.attributes["receipt.state"] == "outcome_unknown"
    assert [(t, s) for t, s, _ in read.links] == [(write.trace_id, write.span_id)]

    # Later, the CLI: the read proves absence now (past the settle delay); its span is linked, not a child.
    wait_for(
        lambda: reconcile_cli(proxy, receipt_id, otlp)["state"] == "safe_to_retry",
        timeout=20,
        interval=0.5,
        what="the CLI's reconcile to prove absence once the settle delay passed",
    )
    (cli,) = otlp.wait_for(named("receipt.reconcile", **{"receipt.state": "safe_to_retry"}), what="the CLI's span")
    assert cli.resource["service.name"] == "receipt-proxy-cli" and cli.parent_span_id == ""
    assert cli.attributes["receipt.id"] == receipt_id and cli.attributes["receipt.read"] is True
    assert [(t, s) for t, s, _ in cli.links] == [(write.trace_id, write.span_id)]

    # JSON logs: the write's and the retry's lines name the receipt, its state and their traces.
    mine = [x for x in logged if x.get("receipt") == receipt_id]
    assert {x.get("trace_id") for x in mine} >= {write.trace_id, dup.trace_id}
    assert all(x["api"] == "test-api" and x["operation"] == "messages.create" for x in mine if "api" in x)
    assert {"time", "level", "event", "logger"} <= set(logged[0])
    no_secret_in(otlp.received())


def test_a_traceparent_makes_the_proxy_span_its_child_and_goes_on_upstream(tmp_path, confdir, upstream, bucket, otlp):
    proxy = start(tmp_path, confdir, str(tmp_path / "receipts.db"), otlp)
    try:
        path = f"/api/{bucket}/things"
        agent = {"traceparent": f"00-{AGENT_TRACE}-{AGENT_SPAN}-01", "tracestate": "agent=1"}
        answer = Clients(proxy).send("httpx", "POST", upstream.url + path, {"title": "child"}, headers=agent)
        assert answer.status == 201
        (span,) = otlp.wait_for(named("POST test-api.things.create"), what="the write's span")
    finally:
        proxy.stop()
    assert (span.trace_id, span.parent_span_id, span.kind) == (AGENT_TRACE, AGENT_SPAN, SERVER)
    a = span.attributes
    assert (a["receipt.state"], a["receipt.upstream_status"], a["receipt.sent"]) == ("succeeded", 201, True)
    (sent,) = [r for r in upstream.requests if r["path"].startswith(path)]
    assert sent["headers"]["traceparent"].startswith(f"00-{AGENT_TRACE}-{span.span_id}-")  # the proxy span
    assert sent["headers"]["tracestate"] == "agent=1"
    no_secret_in(otlp.received())


@pytest.mark.parametrize(
    "asked",
    [("--set", "receipts_otel=http://127.0.0.1:4318"), ()],
    ids=["receipts_otel", "OTEL_EXPORTER_OTLP_ENDPOINT"],
)
def test_asked_for_without_the_extra_the_proxy_stops_naming_it(tmp_path, confdir, asked):
    # A package `opentelemetry` first on the path that fails to import, as on an install without the extra.
    (tmp_path / "shadow" / "opentelemetry").mkdir(parents=True)
    (tmp_path / "shadow" / "opentelemetry" / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shadow")}
    if not asked:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:4318"
    proxy = Proxy(tmp_path, confdir, extra=asked)
    p = subprocess.run(proxy.args(), capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "pip install 'receipt-proxy[otel]'" in out
    assert ("receipts_otel:" if asked else "$OTEL_EXPORTER_OTLP_ENDPOINT:") in out


def test_off_the_proxy_leaves_a_traceparent_as_the_agent_sent_it(tmp_path, confdir, upstream, bucket, monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    proxy = Proxy(tmp_path, confdir).start()  # neither receipts_otel nor an OTEL_EXPORTER_OTLP_* variable
    try:
        path, parent = f"/api/{bucket}/things", f"00-{AGENT_TRACE}-{AGENT_SPAN}-01"
        answer = Clients(proxy).send(
            "requests", "POST", upstream.url + path, {"title": "off"}, headers={"traceparent": parent}
        )
        assert answer.status == 201
    finally:
        proxy.stop()
    (sent,) = [r for r in upstream.requests if r["path"].startswith(path)]
    assert sent["headers"]["traceparent"] == parent and "OpenTelemetry on" not in proxy.log()


def test_a_persons_resolution_is_a_span_linked_to_the_write(tmp_path, confdir, upstream, bucket, otlp):
    proxy = start(tmp_path, confdir, str(tmp_path / "receipts.db"), otlp)
    try:
        path = f"/api/{bucket}/plain"
        upstream.plan(path, "drop")  # committed, then the connection dropped: outcome_unknown
        first = Clients(proxy).send("requests", "POST", upstream.url + path, {"title": "by hand"})
        assert first.status == 502
        receipt_id = first.headers["x-receipt-id"]
        (write,) = otlp.wait_for(named("POST test-api.plain.create"), what="the write's span")
    finally:
        proxy.stop()
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url}
    args = [str(RECEIPTS), "--db", str(proxy.db), "resolve", receipt_id, "--as", "succeeded"]
    out = subprocess.run(
        [*args, "--note", "seen in the dashboard"], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    (span,) = otlp.wait_for(named("receipt.resolve"), what="the resolution's span")
    assert (span.attributes["receipt.id"], span.attributes["receipt.state"]) == (receipt_id, "succeeded")
    assert span.attributes["receipt.state.before"] == "outcome_unknown" and span.parent_span_id == ""
    assert [(t, s) for t, s, _ in span.links] == [(write.trace_id, write.span_id)]
    assert "seen in the dashboard" not in repr(span)  # a person's note is free text: not in a span
    no_secret_in(otlp.received())


def test_the_histograms_exemplars_carry_the_writes_trace_id_to_an_openmetrics_scrape(
    tmp_path, confdir, upstream, bucket, otlp
):
    proxy = start(tmp_path, confdir, str(tmp_path / "receipts.db"), otlp, "--set", "receipts_metrics=127.0.0.1:0")
    try:
        path = f"/api/{bucket}/things"
        assert Clients(proxy).send("requests", "POST", upstream.url + path, {"title": "measured"}).status == 201
        (span,) = otlp.wait_for(named("POST test-api.things.create"), what="the write's span")
        openmetrics = exemplars(proxy, OPENMETRICS)
        text = exemplars(proxy, "text/plain")
    finally:
        proxy.stop()
    assert openmetrics == {("receipt_commit", span.trace_id), ("upstream", span.trace_id)}
    assert text == set()  # the Prometheus text format has no exemplars


def test_off_no_histogram_has_an_exemplar(tmp_path, confdir, upstream, bucket, monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    proxy = Proxy(tmp_path, confdir, extra=("--set", "receipts_metrics=127.0.0.1:0")).start()
    try:
        path = f"/api/{bucket}/things"
        assert Clients(proxy).send("requests", "POST", upstream.url + path, {"title": "unmeasured"}).status == 201
        scraped = requests.get(
            wait_for(lambda: METRICS_URL.search(proxy.log()), timeout=10, what="the metrics URL").group(1),
            headers={"Accept": OPENMETRICS},
            timeout=10,
        )
    finally:
        proxy.stop()
    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    assert 'receipt_proxy_upstream_seconds_count{api="test-api",operation="things.create"} 1.0' in scraped.text
    assert " # {" not in scraped.text  # no exemplar anywhere


def test_an_mcp_tool_call_is_a_span_of_the_mcp_conventions(tmp_path, confdir, mcp_json_server, otlp):  # noqa: F811
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "tracker.yaml").write_text(MCP_RULES)
    proxy = Proxy(tmp_path, confdir, rules=rules, extra=("--set", f"receipts_otel={otlp.url}")).start()
    args = {"title": "Printer traced", "body": "Never in a span"}  # the intent's named fields: never in a span
    try:
        report = run_client(
            mcp_json_server.url, [("call", "create_issue", args)], revision="2026-07-28", proxy=proxy.url, ca=proxy.ca
        )
        ((result,), (sent,)) = report["results"], [h for h in report["http"] if h["jsonrpc_method"] == "tools/call"]
        assert result["ok"] and not result["is_error"], report
        (span,) = otlp.wait_for(named("tools/call create_issue"), what="the tool call's span")
    finally:
        proxy.stop()
    a = span.attributes
    assert (a["mcp.method.name"], a["gen_ai.tool.name"], a["gen_ai.operation.name"]) == (
        "tools/call",
        "create_issue",
        "execute_tool",
    )
    assert a["jsonrpc.request.id"] == str(sent["id"]) and span.kind == SERVER
    assert (a["receipt.api"], a["receipt.operation"], a["receipt.state"]) == ("tracker", "issues.create", "succeeded")
    assert a["http.request.method"] == "POST" and a["http.response.status_code"] == 200
    assert mcp_json_server.effects()["created"] >= 1
    spans = otlp.received()
    assert not any(x in repr((s.attributes, s.events)) for s in spans for x in args.values())  # no argument
    no_secret_in(spans)


def test_an_approval_wait_is_a_child_span_that_ends_with_the_persons_decision(
    tmp_path, confdir, upstream, bucket, otlp
):
    proxy = start(tmp_path, confdir, str(tmp_path / "receipts.db"), otlp)
    got: list = []
    path = f"/api/{bucket}/refunds"  # approve: true (tests/rules)

    def send() -> None:  # the agent's request, held until approved
        got.append(Clients(proxy).send("requests", "POST", upstream.url + path, {"amount": 7}, timeout=60))

    agent = threading.Thread(target=send)
    try:
        agent.start()
        receipt_id = held_id(Path(proxy.db), bucket)
        approved = subprocess.run(
            [str(RECEIPTS), "--db", str(proxy.db), "approve", receipt_id, "--note", "fine"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert approved.returncode == 0, approved.stderr
        agent.join(timeout=60)
        (answer,) = got
        assert answer.status == 201
        (write,) = otlp.wait_for(named("POST test-api.refunds.create"), what="the write's span")
        (wait,) = otlp.wait_for(named("receipt.approval_wait"), what="the approval wait's span")
    finally:
        proxy.stop()
        agent.join(timeout=60)
    assert (wait.kind, wait.trace_id, wait.parent_span_id) == (INTERNAL, write.trace_id, write.span_id)
    assert wait.attributes["receipt.id"] == receipt_id == write.attributes["receipt.id"]
    assert wait.attributes["receipt.state"] == "submitted"  # approved: sent next
    assert [(name, attrs.get("receipt.state")) for name, attrs in wait.events] == [("receipt.decided", "submitted")]
    assert write.attributes["receipt.state"] == "succeeded" and upstream.seen(path) == 1
    no_secret_in(otlp.received())


def test_a_receipt_taken_over_after_a_lease_expired_is_a_span_linked_to_the_write(
    pg_url, tmp_path, confdir, upstream, bucket, otlp
):
    # Two proxies share PostgreSQL; A commits a write and is stopped whole (SIGSTOP) before its first
    # byte. Its lease expires; B's heartbeat takes the receipt over: a span of B's, linked to A's write.
    both = ("--set", f"receipts_secret={tmp_path / 'fleet.key'}", *FAST_LEASE)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = start_later(tmp_path / "a", confdir, pg_url, otlp, *both, "--set", "receipts_debug_pause=after_commit:60")
    b = start_later(tmp_path / "b", confdir, pg_url, otlp, *both)
    start_all([a, b])
    path = f"/api/{bucket}/things"
    agent, _ = send_in_background(a, upstream.url + path, {"title": "left behind"})
    try:
        stopped_after_commit(a)
        first = only_receipt(pg_url, bucket)
        taken = recovered(pg_url, bucket, first.operation_id)
        (span,) = otlp.wait_for(named("receipt.lease_expired"), what="the takeover's span")
    finally:
        woken(a)
        a.stop()
        b.stop()
        agent.join(timeout=120)
    assert first.trace_parent is not None and taken.instance == first.instance == instance_id(a)
    _, write_trace, write_span, _ = first.trace_parent.split("-")
    assert (span.kind, span.parent_span_id) == (INTERNAL, "")  # a root of its own, in B
    assert [(t, s) for t, s, _ in span.links] == [(write_trace, write_span)]
    s = span.attributes
    assert (s["receipt.id"], s["receipt.state"], s["receipt.instance"]) == (
        first.operation_id,
        "outcome_unknown",
        first.instance,
    )
    assert (s["receipt.api"], s["receipt.operation"]) == ("test-api", "things.create")
    assert upstream.seen(path) == 0
    no_secret_in(otlp.received())
