"""
An MCP tool call's event-stream answer (Streamable HTTP, `text/event-stream`), passed on to the
agent as it comes and classified as soon as the call's own response is in it.

Why: the server may send any number of notifications (progress, log messages) and requests of
its own on the call's stream before the call's response, and may keep the stream open after it.
Held whole, as other answers are (exchange.py), the agent would see none of them before the end,
and a stream too long, or one that never ends, would leave a success `outcome_unknown`.

How, for a 2xx event-stream answer to a tool call without a Content-Encoding (`streamed_if`,
asked by exchange.send with the answer's head; the relay listens before the call is sent):
- the `request` hook routes the flow to the relay (relay.py) and returns; mitmproxy streams what
  the relay gives it: the upstream's head (with X-Receipt-Id, and X-Receipt-State `submitted`:
  it goes out before the outcome is known), then the body;
- a task of its own (`_follow`) reads the body as it comes, one event at a time
  (wire/call_answer.py). Every event is passed on once it has ended: notifications, the server's
  requests, comments. An event larger than receipts_response_cap is passed on as it comes,
  unread.
- When the call's response (its own id) has ended: its outcome is classified (outcome/tool_outcomes.py),
  recorded, and only then passed on: an agent that gets the result and sends the call again is
  replayed. The receipt records the response's event, never the rest of the stream.
- After that the rest of the stream is passed on as it comes, and not read: when it ends, when
  it breaks (the agent's stream is cut as the upstream's was), or when the agent goes (looked at
  every 0.2 s: the upstream connection is closed), the receipt stays as recorded.
- Before it: the stream breaking, or receipts_upstream_timeout passing, is `outcome_unknown`, as
  for any answer; the agent's stream then ends with the proxy's own answer, an `isError` result
  under the call's id, in one more event (unless it was cut inside an event: then it is cut). A
  stream that ends cleanly without the response is `outcome_unknown` too, and ends as the
  upstream ended it (the agent may resume it, as the transport allows). The reading goes on
  after the agent has gone, until the outcome is known or the deadline passes.
Memory: one event (up to receipts_response_cap), the response's event, and what waits for the
agent (up to PIPE bytes; past that, reading waits for the agent, up to the deadline before the
response). The drain (drain.py) waits for the task as for a request hook.

An event stream the proxy records nothing from (a session's GET stream, the answer to a
message no rule names) streams through mitmproxy itself, unread (`pass_untouched`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from mitmproxy import http

from proxy_addon.gate.admission import Gate
from proxy_addon.gate.metrics import Metrics
from proxy_addon.mitm import record
from proxy_addon.mitm.drain import Drain
from proxy_addon.mitm.exchange import Reply
from proxy_addon.mitm.flows import META, headers_of
from proxy_addon.mitm.relay import Pipe, Relay
from proxy_addon.mitm.tools import LISTING
from proxy_addon.outcome import http_answers as answers
from proxy_addon.outcome import tool_answers as mcp_answers
from proxy_addon.outcome.classify import Outcome, deadline_outcome, failure_outcome
from proxy_addon.outcome.exchange_failures import CLIENT_ERRORS
from proxy_addon.outcome.tool_outcomes import tool_outcome
from proxy_addon.rules import Operation
from proxy_addon.states import State
from proxy_addon.wire.call_answer import CallAnswer
from proxy_addon.wire.jsonrpc import is_sse
from proxy_addon.wire.mcp_calls import ToolCall

logger = logging.getLogger(__name__)

PIPE = 256 * 1024  # bytes passed on that may wait for a slow agent before reading waits for it
POLL = 0.2  # seconds between two looks at whether the agent is still there


def streamed_if(op: Operation, meta: dict) -> Callable[[int, list[tuple[bytes, bytes]]], bool] | None:
    """
    For exchange.send: whether an answer's head (status, header fields) makes it streamed: a
    2xx event stream, without a Content-Encoding, to a tool call with an id. None: never.
    """
    if op.mcp_tool is None or (meta.get("mcp") or {}).get("id") is None:
        return None

    def streamed(status: int, fields: list[tuple[bytes, bytes]]) -> bool:
        if not 200 <= status < 300:
            return False
        named = {k.lower(): v for k, v in fields}
        ctype = named.get(b"content-type", b"").decode("latin-1")
        return is_sse(ctype) and named.get(b"content-encoding", b"identity").strip().lower() == b"identity"

    return streamed


@dataclass(eq=False)
class _Stream:
    flow: http.HTTPFlow
    meta: dict
    op: Operation
    reply: Reply
    pipe: Pipe
    cap: int
    timeout: float
    call: ToolCall = field(init=False)
    answer: CallAnswer = field(init=False)  # the body read so far (one event at a time)
    token: str = ""  # its route to the relay

    def __post_init__(self) -> None:
        self.call = ToolCall(**self.meta["mcp"])
        self.answer = CallAnswer(self.call.id, limit=self.cap)

    @property
    def recorded(self) -> bool:
        return "outcome" in self.meta

    def wanted(self) -> bool:
        """The agent is still there to read."""
        return self.flow.client_conn.connected and not self.pipe.abandoned


class Streams:
    """The streamed answers in flight, and the relay they reach mitmproxy through (module docstring)."""

    def __init__(self, drain: Drain) -> None:
        self.relay = Relay()
        self._drain = drain
        self._running: dict[asyncio.Task, _Stream] = {}
        self._by_flow: dict[str, _Stream] = {}

    async def ready(self) -> None:
        """Before a call whose answer may stream is sent: the relay listens (a failure here: nothing was sent)."""
        await self.relay.start()

    async def start(
        self,
        flow: http.HTTPFlow,
        meta: dict,
        op: Operation,
        reply: Reply,
        *,
        gate: Gate,
        metrics: Metrics,
        cap: int,
        timeout: float,
    ) -> None:
        """From the request hook, which then returns: route the flow to the relay, and follow the answer."""
        head = reply.response.copy()  # what the agent gets; the reply's stays as the upstream sent it, to record
        head.headers["X-Receipt-Id"] = meta["operation_id"]
        head.headers["X-Receipt-State"] = meta["state"]
        s = _Stream(flow, meta, op, reply, Pipe(PIPE), cap, timeout)
        meta["streamed"] = True  # the response and error hooks record nothing for it: the task does
        s.token = self.relay.route(flow, head, s.pipe)
        task = asyncio.get_running_loop().create_task(self._follow(s, gate, metrics))
        self._running[task] = s
        self._by_flow[flow.id] = s
        task.add_done_callback(self._ended)
        self._drain.follow(task, flow, meta)

    def headers(self, flow: http.HTTPFlow) -> None:
        """
        The responseheaders hook: a routed flow gets its request back as sent, and its answer
        streams; so does an event stream the proxy neither records nor reads (`pass_untouched`).
        """
        if not self.relay.restore(flow):
            pass_untouched(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        """mitmproxy gave up on a routed flow (the agent left, say): nothing more is passed on."""
        self.relay.restore(flow)
        if (s := self._by_flow.get(flow.id)) is not None:
            s.pipe.abandon()

    async def aclose(self) -> None:
        """At shutdown: what is still read is cut (outcome_unknown before the response), then the relay closes."""
        for task in list(self._running):
            task.cancel("receipt-proxy: the proxy stopped")
        for task in list(self._running):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.relay.aclose()

    def _ended(self, task: asyncio.Task) -> None:
        s = self._running.pop(task, None)
        if s is None:
            return
        if self._by_flow.get(s.flow.id) is s:
            del self._by_flow[s.flow.id]
        if s.pipe.abandoned:  # its agent has gone: mitmproxy will not come for it (if it has not yet)
            self.relay.drop(s.token)

    # --- the answer, as it comes -----------------------------------------------------------

    async def _follow(self, s: _Stream, gate: Gate, metrics: Metrics) -> None:
        try:
            await self._pump(s, gate, metrics)
        except asyncio.CancelledError as e:  # the drain cut it, or the proxy stops
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            why = str(e.args[0]).removeprefix("receipt-proxy: ") if e.args else "the proxy stopped"
            await self._lost(s, gate, metrics, Outcome(State.OUTCOME_UNKNOWN, f"outcome unknown: {why}", error=why))
        except Exception as e:  # a fault of ours: the outcome is not known, and said so loudly
            logger.exception(f"receipt {s.meta['operation_id']}: internal error reading the streamed answer")
            why = f"outcome unknown: internal error reading the answer: {type(e).__name__}: {e}"
            await self._lost(s, gate, metrics, Outcome(State.OUTCOME_UNKNOWN, why, error=why))
        finally:
            s.pipe.end(broken=True)  # nothing if it ended already
            with contextlib.suppress(Exception):
                await s.reply.aclose()

    async def _pump(self, s: _Stream, gate: Gate, metrics: Metrics) -> None:
        answer = s.answer
        chunks = s.reply.chunks
        loop = asyncio.get_running_loop()
        pending: asyncio.Task[bytes | None] | None = None
        try:
            while True:
                if pending is None:
                    pending = loop.create_task(_next(chunks))
                wait = POLL
                if not s.recorded:
                    wait = min(POLL, s.reply.ends - loop.time())
                    if wait <= 0:
                        await self._lost(s, gate, metrics, deadline_outcome(s.timeout))
                        return
                done, _ = await asyncio.wait([pending], timeout=wait)
                if not s.wanted():
                    s.pipe.abandon()
                    if s.recorded:  # the agent has its result and has gone: the upstream connection is closed
                        return
                if not done:
                    continue
                try:
                    chunk = pending.result()
                except CLIENT_ERRORS as e:  # the stream broke
                    if not s.recorded:
                        await self._lost(s, gate, metrics, failure_outcome(e))
                    else:
                        logger.info(
                            f"receipt {s.meta['operation_id']}: the event stream broke after the call's result "
                            f"({type(e).__name__}); recorded as {s.meta.get('state')}"
                        )
                        s.pipe.end(broken=True)
                    return
                pending = None
                if chunk is None:  # the stream ended
                    if not s.recorded:
                        await self._ended_without_response(s, gate, metrics)
                    s.pipe.end()
                    return
                if s.recorded:
                    await s.pipe.put(chunk, wanted=s.wanted)
                    continue
                batch: list[bytes] = []
                for part in answer.feed(chunk):
                    if part.kind == "response":
                        await s.pipe.put(b"".join(batch), wanted=s.wanted, until=s.reply.ends)
                        batch = []
                        await self._record_response(s, gate, metrics)
                    batch.append(part.raw)
                await s.pipe.put(b"".join(batch), wanted=s.wanted, until=None if s.recorded else s.reply.ends)
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, *CLIENT_ERRORS):
                    await pending

    async def _record_response(self, s: _Stream, gate: Gate, metrics: Metrics) -> None:
        """The call's response has come: its outcome, recorded from its event alone (the head, and that event)."""
        head = s.reply.response
        status, body = head.status_code, s.answer.response_event
        kept = answers.recorded(status, head.headers.items(multi=True), body, s.cap)
        result = tool_outcome(status, head.reason, headers_of(head), body, s.op, kept, s.call.id, task_call=s.call.task)
        await record.outcome(gate, metrics, s.flow, s.meta, result, s.op)

    async def _ended_without_response(self, s: _Stream, gate: Gate, metrics: Metrics) -> None:
        """The stream ended cleanly with no response to the call: outcome_unknown, the head recorded."""
        answer = s.answer
        answer.end()  # an unfinished last event: a client's parser drops it, and so is it here
        head = s.reply.response
        kept = answers.recorded(head.status_code, head.headers.items(multi=True), b"", s.cap)
        result = tool_outcome(head.status_code, head.reason, headers_of(head), b"", s.op, kept, s.call.id)
        if answer.too_large:
            why = (
                f"{result.reason}; {answer.too_large} event(s) larger than receipts_response_cap "
                f"({s.cap} bytes) were passed on unread"
            )
            result = Outcome(result.state, why, error=why, http_status=result.http_status, response=kept)
        await record.outcome(gate, metrics, s.flow, s.meta, result, s.op)

    async def _lost(self, s: _Stream, gate: Gate, metrics: Metrics, result: Outcome) -> None:
        """
        The answer is lost (it broke, the deadline passed, the proxy stops). Before the call's
        response: record that, and end the agent's stream with the proxy's own answer, as one
        more event (cut instead, if it stopped inside an event). After it: the stream is cut.
        """
        if s.recorded:
            s.pipe.end(broken=True)
            return
        await record.outcome(gate, metrics, s.flow, s.meta, result, s.op)
        logger.warning(
            f"receipt {s.meta['operation_id']}: the event stream ended before the call's response: "
            f"{result.reason}; recorded as {s.meta.get('state')}"
        )
        if s.answer.mid_event:
            s.pipe.end(broken=True)
            return
        failed = answers.exchange_failed(
            s.meta["operation_id"], State(s.meta.get("state", result.state)), result.reason, timed_out=result.timed_out
        )
        s.pipe.end(mcp_answers.as_tool_answer(failed, s.call, "text/event-stream").body)


def pass_untouched(flow: http.HTTPFlow) -> None:
    """
    An event stream that is no write's answer (no receipt is recorded from it) streams to the
    agent as it comes, as mitmproxy streams a body with streaming on: an MCP session's GET
    stream, where a server sends requests of its own (the SDK's `list_roots()`, a sampling
    request not tied to a call) and notifications, and the stream answering a message no rule
    names (a read tool's call, whose server may ask the agent too). Held whole, as mitmproxy
    holds a body by default, none of it would reach the agent before the stream ended, which a
    GET stream never does. A write's answer (mitmproxy forwarding it: `receipts_forward`) and a
    tools/list answer the proxy reads (tools.py) are held as before.
    """
    resp = flow.response
    if resp is None or META in flow.metadata or LISTING in flow.metadata:
        return
    if is_sse(resp.headers.get("content-type")):
        resp.stream = True


async def _next(chunks: AsyncIterator[bytes]) -> bytes | None:
    return await anext(chunks, None)


__all__ = ["Streams", "pass_untouched", "streamed_if"]
