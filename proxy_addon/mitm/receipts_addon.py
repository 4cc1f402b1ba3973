"""
The receipts addon's hooks: receipt committed → forward once → classify → block duplicates.

Hooks, one job each:
- `load` / `configure` / `running` / `done`: declare and check the options, load the rules,
  open the store (mitm/receipts_db.py: crash recovery included), build the upstream client.
- `requestheaders`: match a rule; a matched request is never streamed (the receipt must be
  committed before any byte leaves), and its body is collected within receipts_body_cap
  (internals.BoundedBody). Unmatched requests touch neither the database nor the
  fingerprint code.
- `request`: refuse a body above receipts_body_cap (413) or one whose Content-Encoding
  cannot be decoded (400), and a header field no HTTP client can send (400: wire/fields.py),
  before any receipt; hand a matched request to the gate (gate/admission.py)
  with its decoded body, then send it once ourselves (exchange.py) and record what happened,
  or answer from an existing receipt (409 blocked, recorded replay, 503 when the store
  cannot be written).
- `responseheaders`: an MCP tool call's event stream, routed to the relay by `request`, streams
  (streaming.py); so does any event stream no receipt records (an MCP session's GET stream).
- `response` / `error`: record outcomes (record.py) when mitmproxy forwards (`receipts_forward=mitmproxy`);
  read an MCP task's answer passing through (mitm/task_watch.py: it may settle the write waiting for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader

from proxy_addon.errors import BadJson, ReceiptsError, RulesError, StoreError, UncountableWrite, UnpairedSurrogate
from proxy_addon.gate.admission import Admitted, Gate
from proxy_addon.gate.installation import Installation
from proxy_addon.gate.leases import HeldLease
from proxy_addon.gate.metrics import Metrics
from proxy_addon.gate.send_guard import SendGuard
from proxy_addon.gate.store_thread import StoreThread
from proxy_addon.intent.fingerprint import build_attempt, text_headers
from proxy_addon.mitm import (
    body_match,
    exchange,
    flows,
    forward,
    internals,
    json_logs,
    options,
    record,
    refusals,
    request_body,
    streaming,
    tools,
    tracing,
)
from proxy_addon.mitm import task_watch as tasks
from proxy_addon.mitm.approval import Approvals, await_approval
from proxy_addon.mitm.drain import Drain
from proxy_addon.mitm.flow_spans import FlowSpans
from proxy_addon.mitm.flows import META, mark, request_view
from proxy_addon.mitm.log_limit import LogLimit
from proxy_addon.mitm.receipts_db import ReceiptsDb
from proxy_addon.outcome import http_answers as answers
from proxy_addon.outcome.classify import Outcome, error_outcome, failure_outcome
from proxy_addon.outcome.exchange_failures import SendStopped
from proxy_addon.reconcile.settle import retry_after
from proxy_addon.rules import Match, Operation, RuleSet, load_rules_path, rules_signature
from proxy_addon.rules.placeholders import placeholders
from proxy_addon.rules.policy_version import policy_version
from proxy_addon.rules.todo_comments import todo_summary
from proxy_addon.rules.tool_catalog import ToolCatalog
from proxy_addon.states import State
from proxy_addon.store import Attempt, Decision, Receipt, ReceiptStore, utcnow
from proxy_addon.wire import terminal
from proxy_addon.wire.fields import bad_field, undecodable
from proxy_addon.wire.mcp_calls import ToolCall
from proxy_addon.wire.redaction import credentials_from

logger = logging.getLogger(__name__)

LOOP_FINGERPRINT = 64 * 1024  # bytes of decoded body up to which a write is fingerprinted on the event loop


class Receipts:
    """Writes a durable receipt before forwarding a matched request, and blocks unresolved duplicates."""

    def __init__(self) -> None:
        self.rules: RuleSet | None = None
        self.rules_sig: tuple = ()
        self.rules_problem: str | None = None  # a failed reload's first problem (file:line): flows say so (watch.py)
        self.config_error: str | None = "receipt-proxy is not configured yet"
        self._client: exchange.Client | None = None  # sends matched requests (receipts_forward=addon)
        self._client_config: tuple | None = None
        self._closing: asyncio.Task | None = None  # the replaced client, closing
        self._deadlines = internals.Deadlines()  # receipts_forward=mitmproxy: our upstream deadline
        self._body_cap = 0  # receipts_body_cap, and receipts_debug_pause parsed: read by configure, not per request
        self._pause: tuple[str, float] | None = None
        self.metrics = Metrics()  # this proxy's Prometheus metrics (served by mitm/metrics_server.py)
        self.db = ReceiptsDb(
            self.metrics, post_reads=self._post_reads, on_change=self.refresh_flow
        )  # mitm/receipts_db.py
        self.drain = Drain(self)  # SIGTERM/SIGINT: let the matched requests in flight end, then exit
        self.streams = streaming.Streams(self.drain)  # MCP tool calls' event streams, passed on as they come
        self.approvals = Approvals(lambda: self.calls)  # held writes, and the CLI's decisions on them
        self.tool_catalog = ToolCatalog()  # mcp.tools: from_server: which tools the servers declare read-only
        self._duplicate_lines = LogLimit()  # a retry storm logs one line per receipt every 10 s (mitm/log_limit.py)
        # OpenTelemetry spans (receipts_otel, OTEL_EXPORTER_OTLP_*: mitm/tracing.py); None while off: no hook
        # does more than test for it, and nothing of OpenTelemetry is imported.
        self.traces: FlowSpans | None = None
        self._json_logs = False  # receipts_log_format=json: the hooks tell mitm/json_logs.py which write logs

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def installation(self) -> Installation | None:
        return self.db.installation

    @property
    def gate(self) -> Gate | None:
        return self.db.gate

    @property
    def calls(self) -> StoreThread | None:
        return self.db.calls

    @calls.setter
    def calls(self, calls: StoreThread | None) -> None:  # tests put a failing one in the approvals' way
        self.db.calls = calls

    def reader(self) -> ReceiptStore | None:
        """A connection for reads on the event loop's thread (the content view, commands)."""
        return self.db.reader()

    def load(self, loader: Loader) -> None:
        # httpx logs every request URL at INFO, query tokens included; our own lines redact them.
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
        terminal.escape_logs()  # an upstream's text (a reason phrase, an id) never writes raw controls to a terminal
        internals.skip_legacy_log_events(loader.master)  # a log line costs no add_log event nobody listens to
        options.declare(loader)
        options.check_deferred(loader)
        # With eager connections, upstream failures happen at CONNECT time, outside any flow,
        # and a receipt would never learn of them.
        if "connection_strategy" in loader.master.options:  # absent only without the proxyserver addon
            loader.master.options.update(connection_strategy="lazy")

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        options.check(opts)
        if "receipts_log_format" in updated:  # first: the lines this hook logs are JSON already
            json_logs.configure(opts.receipts_log_format, self.traces)
            self._json_logs = opts.receipts_log_format == "json"
        if "receipts_db" in updated and self.db.hide_password(opts):
            return  # configured again, with the value shown: nothing more to do
        if "receipts_rules" in updated or self.rules is None:
            try:
                sig = rules_signature(opts.receipts_rules)
                rules = load_rules_path(opts.receipts_rules)
            except RulesError as e:
                if self.rules is not None:  # a reload (mitmweb's Options): the last good rules stay
                    self.metrics.reloaded(False)
                raise exceptions.OptionsError(f"receipts_rules: {e}") from None
            if self.rules is not None:
                self.metrics.reloaded(True)
            self.rules, self.rules_sig, self.rules_problem = rules, sig, None
            self.metrics.known(rules.operations)
            logger.info(f"receipt-proxy: {len(rules.operations)} operations from {opts.receipts_rules}")
            for warning in [*placeholders(opts.receipts_rules), *todo_summary(opts.receipts_rules)]:
                logger.warning(f"receipt-proxy: {warning}")
            tools.say_reads(rules)
        self.db.configure(opts)
        self._configure_client()
        assert self.gate is not None
        self.gate.settings = options.gate_settings(opts)
        if "receipts_otel" in updated or self.config_error:
            self.traces = tracing.configure(self.traces, opts.receipts_otel)  # OptionsError without the extra
            self.gate.spans = self.traces.spans if self.traces is not None else None
            json_logs.configure(opts.receipts_log_format, self.traces)  # their trace ids
        try:  # before any write is admitted: which earlier fingerprints its receipts may have (gate/admission.py)
            versions = self.gate.load_versions(self.rules)
        except ReceiptsError as e:
            raise exceptions.OptionsError(
                f"receipts_db: cannot read which fingerprint versions it holds: {e}"
            ) from None
        for line in versions.warnings():
            logger.warning(f"receipt-proxy: {line}")
        self._body_cap, self._pause = opts.receipts_body_cap, options.parse_debug_pause(opts.receipts_debug_pause)
        if "receipts_mode" in updated or self.config_error:
            self._say_mode(opts.receipts_mode)
        self.config_error = None

    def _say_mode(self, mode: str) -> None:
        """receipts_mode, at startup and when it changes: in the log, and in the metrics' `mode` gauge."""
        self.metrics.in_mode(mode)
        if mode == "observe":
            logger.warning(
                "receipt-proxy: receipts_mode=observe (shadow mode): every write is recorded and SENT; duplicates "
                "are not blocked or replayed, approvals do not hold, deny decisions do not refuse: their receipts' "
                "events say what enforcement would have done (receipts report --since 1d)"
            )
        else:
            logger.info(
                "receipt-proxy: receipts_mode=enforce: duplicates blocked or replayed, approvals and denials applied"
            )

    def _post_reads(self, api: str) -> tuple:
        return self.rules.post_reads(api) if self.rules else ()

    def _configure_client(self) -> None:
        opts = ctx.options
        upstream = options.upstream_of(opts)
        config = (opts.receipts_forward, upstream)
        if config == self._client_config:
            return
        old, self._client_config = self._client, config
        self._client = exchange.make_client(upstream) if opts.receipts_forward == "addon" else None
        if old is not None:
            self._closing = asyncio.get_running_loop().create_task(old.aclose())  # kept until it ends

    def running(self) -> None:
        logger.info(
            f"receipt-proxy: ready ({'NOT configured: ' + self.config_error if self.config_error else 'recording'})"
            + (" in observe mode: nothing blocked, held or denied" if ctx.options.receipts_mode == "observe" else "")
        )

    async def done(self) -> None:
        await self.streams.aclose()
        self.db.stop_listening()
        self.metrics.close()
        self.approvals.close()
        self.db.close_reader()
        if self._client is not None:
            await self._client.aclose()
        self._deadlines.cancel_all()
        self.db.close()
        if self.traces is not None:  # the spans still batched are exported before the process exits
            self.traces.close()

    # --- hooks -----------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        internals.ack_now(flow)
        if self.rules is None or self.config_error:
            # Not configured (yet): we cannot tell writes from reads, so nothing passes.
            flow.metadata[META] = {"api": "*", "operation": "*", "params": {}}
            return
        req = flow.request
        m = self.rules.match(req.host, req.port, req.method, req.path, headers=req.headers.fields)
        if m is None:
            return
        req.stream = False  # the receipt must be committed before any byte leaves
        flow.metadata[META] = {"api": m.operation.api, "operation": m.operation.name, "params": m.params}
        if m.operation.errors != "plain":  # the envelope of the proxy's own answers (flows.answer)
            flow.metadata[META]["errors"] = m.operation.errors
        if self.rules_problem:  # the rules on disk did not load: the last good ones decide this flow
            flow.metadata[META]["rules_problem"] = self.rules_problem
        if m.refused:  # its method override headers, or a target servers read differently: 400 in `request`
            flow.metadata[META].update(refused=m.refused, refused_as=m.refused_as)
        if m.fingerprint_host:  # matched through another loopback name than the rule's (RuleSet)
            flow.metadata[META]["fingerprint_host"] = m.fingerprint_host
        if m.pending:
            flow.metadata[META]["pending"] = True  # a GraphQL rule: the body decides (request hook)
        request_body.bound(flow, flow.metadata[META], self._body_cap)

    async def request(self, flow: http.HTTPFlow) -> None:
        meta = flow.metadata.get(META)
        if meta is None or flow.response or flow.error or not flow.live:
            return
        body = await request_body.decoded(flow, meta, self._body_cap, configured=not self.config_error)
        if body is None:  # refused for its body (413, 400): never sent, whatever the rules say by now
            self.metrics.refused(meta["api"], meta["operation"], meta.get("answer", ""))
            return
        rules = self.rules if meta.pop("pending", False) and not self.config_error else None
        if rules is not None and not body_match.settle(flow, meta, body, rules, self.tool_catalog):  # GraphQL, MCP
            return  # not a write after all: passed through untouched (body_match.py)
        traces, token = self.traces, None
        if traces is not None:  # its span: ended in `response` or `error`, current until this hook returns
            token = traces.begin(flow, meta)
        said = json_logs.current.set(meta) if self._json_logs else None  # JSON log lines name its receipt
        try:
            if meta.get("refused"):  # what the rules cannot take without a guess (RuleSet.match): 400, no receipt
                refusals.refused(flow, meta)
                return
            try:
                async with self.drain.track(flow, meta):
                    await self._begin(flow, meta, body)
            except Exception as e:  # fail closed: whatever broke, the request is not forwarded
                logger.exception("receipt-proxy: internal error before forwarding")
                await self._not_forwarded(flow, meta, f"internal error: {type(e).__name__}: {e}")
        finally:
            self.metrics.refused(meta["api"], meta["operation"], meta.get("answer", ""))
            if traces is not None:
                traces.detach(token)
            if said is not None:
                json_logs.current.reset(said)

    async def _begin(self, flow: http.HTTPFlow, meta: dict, body: bytes) -> None:
        if self.drain.refuses(flow, meta):  # stopping: new matched writes are not sent (drain.py)
            return
        if self.config_error or self.gate is None or self.rules is None or self.installation is None:
            refusals.unavailable(flow, meta, self.config_error or "receipt-proxy is not configured")
            return
        m = self._rematch(flow, meta)
        if m is None:
            return
        if (bad := bad_field(flow.request.headers.fields)) is not None:  # cannot be sent: 400, no receipt
            refusals.bad_header(flow, meta, *bad)
            return
        if (name := undecodable(flow.request.headers.fields, text_headers(m))) is not None:  # bad input: 400
            refusals.undecodable_header(flow, meta, name)
            return
        op, view, inst = m.operation, request_view(flow.request, body), self.installation
        credentials = credentials_from(op.credential_headers, view.headers)
        versions = self.gate.versions.of_operation(op)
        timeout = ctx.options.receipts_upstream_timeout
        # The next round of an MCP call whose server asked for input goes on under its receipt (store/rounds.py).
        continues, rounds = m.mcp_call is not None and m.mcp_call.continues, ctx.options.receipts_mcp_rounds
        observe = ctx.options.receipts_mode == "observe"  # every decision recorded, none enforced (store/attempts.py)
        trace_parent = self.traces.trace_parent(flow) if self.traces is not None else None  # its span, linked later

        def attempt() -> Attempt:
            built = build_attempt(m, view, inst.key, flow_id=flow.id, instance=inst.instance, versions=versions)
            # its lifetime (gate/send_guard.py, reconcile/judge.py)
            return dataclasses.replace(
                built,
                upstream_timeout=timeout,
                continues=continues,
                mcp_rounds=rounds,
                observe=observe,
                trace_parent=trace_parent,
            )

        # The lease, and its epoch before the receipt is committed: a lease lost and taken again since
        # then means another proxy may have taken the receipt over (gate/send_guard.py).
        lease = inst.lease
        epoch = lease.epoch if lease is not None else None

        # A small body is fingerprinted here, and a duplicate answered on the event loop (gate/admission.py);
        # a large one on the store's thread.
        admitted = await self._admit(flow, meta, attempt, op, credentials, here=len(body) <= LOOP_FINGERPRINT)
        if admitted is None:
            return
        decision, receipt = admitted.decision, admitted.decision.receipt
        meta.update(operation_id=receipt.operation_id, state=str(receipt.state), answer=decision.kind)
        if self.traces is not None:
            self.traces.admitted(flow, decision)
        if decision.kind == "forward" and receipt.mcp_rounds:  # the next round of a call whose server asked for input
            meta["round"] = receipt.mcp_rounds + 1
        self._observed(meta, receipt, decision.would)  # observe mode: what enforcement would have done instead
        if decision.kind in ("denied", "over_budget"):  # a `deny` decision (403), past a budget (429): not sent
            refusals.by_rules(flow, meta, decision)
        elif decision.kind != "forward":
            self._answer_from_receipt(flow, op, decision)
        else:
            given_key = admitted.attempt.given_key
            await self._forward(flow, meta, op, receipt, given_key=given_key, body=view.body, lease=(lease, epoch))

    async def _admit(
        self,
        flow: http.HTTPFlow,
        meta: dict,
        attempt: Callable[[], Attempt],
        op: Operation,
        credentials: Mapping[str, str],
        *,
        here: bool,
    ) -> Admitted | None:
        """
        The gate's decision on a write (`here`: fingerprinted on the event loop, else on the store's
        thread); None: it was answered already (503 or 400), no receipt, nothing sent.
        """
        assert self.gate is not None
        try:
            return await self.gate.admit(attempt() if here else attempt, op, credentials)
        except StoreError as e:
            refusals.unavailable(flow, meta, str(e))
        except BadJson as e:  # a key twice in the JSON body (wire/json_body.py): 400, no receipt, never sent
            refusals.bad_json(flow, meta, str(e))
        except UnpairedSurrogate as e:  # bad input, found while fingerprinting: 400, before any receipt
            refusals.unpaired_surrogate(flow, meta, str(e))
        except UncountableWrite as e:  # a budget sums a field the write has no number in: 400, no receipt
            refusals.uncountable(flow, meta, str(e))
        return None

    def _observed(self, meta: dict, receipt: Receipt, would: tuple[str, ...]) -> None:
        """Observe mode: a write sent that enforcement would have blocked, replayed, held or denied (events say so)."""
        if not would:
            return
        meta["would"] = list(would)
        self.metrics.would_have(receipt.api, receipt.operation, would)
        what = ", ".join(w.removeprefix("would_") for w in would)
        of = f" (duplicate of {receipt.shadow_of})" if receipt.shadow_of else ""
        key = receipt.shadow_of or receipt.operation_id  # a retry storm logs one line per original every 10 s
        said = (
            f"receipt {receipt.operation_id}: OBSERVE: enforcement would have {what}{of}; sent (receipts_mode=observe)"
        )
        self._duplicate_lines.log(logger, logging.WARNING, key, said)

    def _answer_from_receipt(self, flow: http.HTTPFlow, op: Operation, decision: Decision) -> None:
        """A duplicate answered from its receipt, nothing sent: the recorded answer replayed, or blocked (409, 422)."""
        receipt = decision.receipt
        if decision.kind == "replay":
            assert decision.answer is not None  # opened by the store for this replay (store/sealing.py)
            replayed = answers.replay(receipt, decision.answer)
            said = "duplicate answered with the recorded response"
            self._answer_duplicate(flow, replayed, "replayed", receipt, "REPLAYED", logging.INFO, said)
            return
        blocked = answers.duplicate(
            receipt,
            decision.kind,
            retry_after=retry_after(op, receipt, utcnow()),
            task_id=decision.task_id,
            note=decision.note,
        )
        prefix = "BLOCKED reused Idempotency-Key" if decision.kind == "key_conflict" else "BLOCKED duplicate"
        said = f"duplicate blocked ({receipt.state})"
        self._answer_duplicate(flow, blocked, "blocked", receipt, prefix, logging.WARNING, said)

    async def _forward(
        self,
        flow: http.HTTPFlow,
        meta: dict,
        op: Operation,
        receipt: Receipt,
        given_key: str | None,
        body: bytes,
        lease: tuple[HeldLease | None, int | None],
    ) -> None:
        """
        Send a new receipt's request once: after an approval if the rule wants one, with the
        proxy's key if any, and only while its lease and its lifetime allow (gate/send_guard.py: asked
        here, and again by the exchange just before the first byte).
        """
        assert self.calls is not None
        meta["retry_of"] = receipt.retry_of
        if receipt.state is State.AWAITING_APPROVAL:
            with self._child("receipt.approval_wait", receipt) as span:  # a child span of the request's (on)
                receipt = await await_approval(
                    flow,
                    meta,
                    receipt,
                    self.calls,
                    ctx.options.receipts_approval_timeout,
                    self.approvals,
                    metrics=self.metrics,
                    policy=lambda: self._policy(meta),
                )
                if span is not None:  # what the person (or the timeout) decided
                    span.set_attribute("receipt.state", str(receipt.state))
                    span.add_event("receipt.decided", {"receipt.state": str(receipt.state)})
            if receipt.state is not State.SUBMITTED:
                return
        forward.add_key(flow, op, receipt, given_key, body)
        if self.traces is not None:  # the upstream sees the proxy span's context (traceparent, tracestate)
            self.traces.inject(flow)
        if receipt.idempotency_key:
            meta["idempotency_key"] = receipt.idempotency_key  # the key sent: told to the agent (X-Receipt-*)
        mark(flow, receipt.state, receipt)
        await self._debug_pause("after_commit", receipt.operation_id)
        guard = SendGuard.of(receipt, *lease, now=utcnow())  # the lease it was committed under
        meta["sent_at"] = time.monotonic()  # receipt_proxy_upstream_seconds, observed when the outcome is recorded
        meta["sent"] = True  # handed to the exchange (a span's receipt.sent, unless the outcome is not_sent)
        if (why := guard()) is not None:
            await self._exchange_failed(flow, meta, failure_outcome(SendStopped(why)))
        elif self._client is not None:
            await self._exchange(flow, meta, op, guard)
        else:
            self._deadlines.arm(flow, guard.deadline(ctx.options.receipts_upstream_timeout))

    async def _exchange_failed(self, flow: http.HTTPFlow, meta: dict, result: Outcome) -> None:
        """Record an exchange that failed (or was never started), and answer the agent so (502, 504)."""
        result = record.of_round(meta, result)  # the next round of an MCP call: its earlier rounds were sent
        receipt = await self._record(flow, meta, result)
        if receipt is None and result.state is State.NOT_SENT:
            logger.warning(f"receipt {meta['operation_id']}: {result.reason} (nothing was sent)")
        failed = answers.exchange_failed(meta["operation_id"], result.state, result.reason, timed_out=result.timed_out)
        flows.answer(flow, failed)

    async def _exchange(self, flow: http.HTTPFlow, meta: dict, op: Operation, guard: SendGuard) -> None:
        """
        Send the request ourselves: the exchange outlives an agent that hangs up (see exchange.py).
        An answer whose body passes receipts_response_cap is recorded from its status first; then
        the rest is read while the agent is there, up to receipts_response_max.
        """
        assert self._client is not None
        opts = ctx.options
        timeout = guard.deadline(opts.receipts_upstream_timeout)  # never past the receipt's in_flight_until
        cap = opts.receipts_response_cap
        if (streamed := streaming.streamed_if(op, meta)) is not None:
            await self.streams.ready()
        result = await exchange.send(
            self._client, flow.request, deadline=timeout, cap=cap, streamed=streamed, guard=guard
        )
        if isinstance(result, Outcome):
            await self._exchange_failed(flow, meta, result)
            return
        if result.streamed:  # an MCP tool call's event stream: passed on as it comes (streaming.py)
            assert self.gate is not None
            await self.streams.start(
                flow, meta, op, result, gate=self.gate, metrics=self.metrics, cap=cap, timeout=timeout
            )
            return
        flow.response = result.response
        try:
            await self._debug_pause("after_answer", meta["operation_id"])
            await self._record_response(flow, meta, complete=result.complete)
            if result.complete:
                return
            rest = await result.read_rest(limit=opts.receipts_response_max, wanted=lambda: flow.client_conn.connected)
        finally:
            await result.aclose()
        forward.pass_rest(flow, meta, rest, limit=opts.receipts_response_max, timeout=opts.receipts_upstream_timeout)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self.streams.headers(flow)

    async def response(self, flow: http.HTTPFlow) -> None:
        tools.learn(flow, self.tool_catalog)
        if self.gate is not None and self.rules is not None:  # a task's answer passing: its write may be settled
            await tasks.learn(flow, self.gate, self.rules)
        meta = self._awaiting_outcome(flow)
        if meta is not None:
            await self._record_response(flow, meta)
        if self.traces is not None:
            self.traces.end(flow)

    async def _record_response(self, flow: http.HTTPFlow, meta: dict, *, complete: bool = True) -> None:
        """Classify and record the answer in `flow.response` (record.py)."""
        assert self.gate is not None
        cap = ctx.options.receipts_response_cap
        await record.answer(self.gate, self.metrics, flow, meta, self._operation(meta), cap=cap, complete=complete)

    async def error(self, flow: http.HTTPFlow) -> None:
        self.streams.error(flow)
        try:
            await self._record_error(flow)
        finally:
            if self.traces is not None:
                self.traces.end(flow)

    async def _record_error(self, flow: http.HTTPFlow) -> None:
        meta = self._awaiting_outcome(flow)
        if meta is None:
            return
        sc = flow.server_conn
        outcome = error_outcome(
            flow.error.msg if flow.error else "unknown error",
            tcp_setup=sc.timestamp_tcp_setup,
            tls=flow.request.scheme == "https",
            tls_setup=sc.timestamp_tls_setup,
            deadline_passed=bool(meta.get("deadline_passed")),
        )
        await self._record(flow, meta, outcome)

    # --- helpers ---------------------------------------------------------------------------

    def _awaiting_outcome(self, flow: http.HTTPFlow) -> dict | None:
        """The flow's receipt metadata if we forwarded it and have not recorded its outcome yet."""
        meta = flow.metadata.get(META)
        if meta is None or meta.get("answer") != "forward" or "outcome" in meta or meta.get("streamed"):
            return None
        self._deadlines.disarm(flow)
        return meta

    def _rematch(self, flow: http.HTTPFlow, meta: dict) -> Match | None:
        """The match found in requestheaders, against the rules in force now."""
        op = self._operation(meta)
        if op is None:  # the rules were reloaded in between and the operation is gone
            flow.metadata.pop(META, None)
            return None
        call = ToolCall(**meta["mcp"]) if meta.get("mcp", {}).get("id") is not None else None
        host = meta.get("fingerprint_host")
        return Match(
            op, dict(meta["params"]), graphql_args=meta.get("graphql_args"), mcp_call=call, fingerprint_host=host
        )

    def _operation(self, meta: dict) -> Operation | None:
        return self.rules.operation(meta["api"], meta["operation"]) if self.rules else None

    def _policy(self, meta: dict) -> str | None:
        """The version of the flow's operation in the rules in force (an approval binds to it); None: gone."""
        op = self._operation(meta)
        return policy_version(op) if op is not None else None

    async def _record(
        self, flow: http.HTTPFlow, meta: dict, outcome: Outcome, op: Operation | None = None
    ) -> Receipt | None:
        """Record a forwarded request's outcome through the gate, and show it on the flow (record.py)."""
        assert self.gate is not None
        return await record.outcome(self.gate, self.metrics, flow, meta, outcome, op)

    def _answer_duplicate(
        self,
        flow: http.HTTPFlow,
        answer: answers.Answer,
        marker: str,
        receipt: Receipt,
        prefix: str,
        level: int,
        said: str,
    ) -> None:
        """A duplicate answered from its receipt, its flow marked, and a log line (one a receipt every 10 s)."""
        flows.answer(flow, answer)
        mark(flow, marker, receipt, prefix=prefix)
        self._duplicate_lines.log(logger, level, receipt.operation_id, f"receipt {receipt.operation_id}: {said}")

    async def _not_forwarded(self, flow: http.HTTPFlow, meta: dict, why: str) -> None:
        """Answer 503 and, if a receipt was already committed, record that it was not sent."""
        if meta.get("answer") == "forward" and "outcome" not in meta:
            await self._record(flow, meta, Outcome(State.NOT_SENT, f"not sent: {why}", error=why))
        refusals.unavailable(flow, meta, why)

    async def _debug_pause(self, point: str, operation_id: str) -> None:
        pause = self._pause
        if pause is not None and pause[0] == point:
            logger.warning(f"receipt {operation_id}: pausing at {point} for {pause[1]:g}s (receipts_debug_pause)")
            await asyncio.sleep(pause[1])

    @contextlib.contextmanager
    def _child(self, name: str, receipt: Receipt) -> Iterator[Any]:
        """A child span of the current request's (None while OpenTelemetry is off)."""
        if self.traces is None:
            yield None
            return
        attributes = {"receipt.id": receipt.operation_id, "receipt.api": receipt.api}
        attributes["receipt.operation"] = receipt.operation
        with self.traces.spans.child(name, attributes) as span:
            yield span

    def refresh_flow(self, receipt: Receipt) -> None:
        flows.refresh(receipt)
