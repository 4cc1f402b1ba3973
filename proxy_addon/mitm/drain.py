"""
Stopping gracefully: on SIGTERM or SIGINT the proxy drains what is in flight, then exits.

1. New matched writes are refused at once: 503 `{"error": "not_sent", "sent": false}`, no
   receipt written, nothing sent: safe to send again, to another proxy or after the restart.
   Unmatched requests keep passing through while the proxy drains (no receipt answers for
   them); whatever of them is still open when mitmproxy exits is cut, as before.
2. Writes held for approval are not sent: their receipts become `not_sent` ("the proxy stopped
   before an operator decided"), and their agents get the same 503 with the receipt's id.
3. Everything else in flight runs to its end, for up to `receipts_drain_timeout` (30 s): the
   exchanges the addon sends itself, duplicates waiting for them, reconcile reads. Their
   outcomes are recorded and their agents answered, then mitmproxy shuts down as usual.
4. What is still in flight when the timeout passes is cut: its receipt is recorded
   `outcome_unknown` ("the proxy stopped: receipts_drain_timeout passed ..."), its agent gets
   502 `outcome_unknown`.
A second signal exits at once (mitmproxy's own shutdown): what is still in flight stays
`submitted` and becomes `outcome_unknown` at the next start (crash recovery,
`Store.recover_in_flight`).

How it hooks into mitmproxy 12: `mitmproxy/tools/main.py` installs its SIGINT/SIGTERM handlers
with `loop.add_signal_handler` before the master runs; `Drain.running` replaces them with
`signalled` (mitmdump and mitmweb alike; the console's Ctrl-C prompt is left alone). The drain
ends with `master.shutdown()`, mitmproxy's own way out (`done` hooks, then exit 0). The hooks
addon (mitm/receipts_addon.py) owns a `Drain` (no global): it runs each matched flow's `request` hook inside
`track()`, which counts it in flight, and asks `refuses()` first thing in `_begin`. An answer
passed on after its hook returned (streaming.py) is counted with `follow()` until it ends. A hook is
cut by cancelling its task; `track()` turns that cancellation into a recorded outcome and an
answer, so mitmproxy sees the hook end normally.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import weakref
from collections.abc import AsyncIterator
from typing import Any, Protocol

from mitmproxy import ctx, http

from proxy_addon.errors import StoreError
from proxy_addon.gate.admission import Gate
from proxy_addon.gate.store_thread import StoreThread
from proxy_addon.mitm import flows, internals
from proxy_addon.mitm.flows import MARKERS, META, mark
from proxy_addon.outcome import http_answers as answers
from proxy_addon.outcome.classify import Outcome
from proxy_addon.states import State
from proxy_addon.store import Receipt


class Holder(Protocol):
    """What the drain needs of the receipts addon (addon.Receipts): its gate and its store's thread."""

    @property
    def gate(self) -> Gate | None: ...

    @property
    def calls(self) -> StoreThread | None: ...


logger = logging.getLogger(__name__)

POLL = 0.05  # seconds between two looks at what is still in flight
PRUNE_AT = 64  # matched flows tracked before the answered ones are dropped (then twice those left)
CUT_GRACE = 3.0  # seconds the flows cut at the timeout get to record their outcome and answer
HELD = "not sent: the proxy stopped before an operator decided"


def stopping_answer(api: str, operation: str, detail: str, receipt: Receipt | None = None) -> answers.Answer:
    """503 for a matched write the proxy does not send because it is stopping (nothing left)."""
    doc: dict[str, Any] = {"error": "not_sent", "sent": False, "api": api, "operation": operation}
    if receipt is not None:
        doc.update(operation_id=receipt.operation_id, state=str(receipt.state))
    doc.update(
        detail=detail,
        hint="the proxy is stopping and sent nothing upstream; it is safe to send the request again, "
        "to another proxy or once this one has restarted",
    )
    headers = {"Retry-After": "5", **(answers.receipt_headers(receipt) if receipt is not None else {})}
    return answers.json_answer(503, doc, headers)


class Drain:
    """The stop sequence: refuse new matched writes, let those in flight end (bounded), then exit."""

    def __init__(self, receipts: Holder) -> None:
        self.receipts = receipts
        self.stopping = False
        # Matched flows until they are answered, pruned at _prune_at; weak: an answered flow mitmproxy has let go is
        # not kept alive here until the next prune.
        self._flows: weakref.WeakSet[http.HTTPFlow] = weakref.WeakSet()
        self._prune_at = PRUNE_AT
        self._hooks: dict[asyncio.Task, tuple[http.HTTPFlow, dict]] = {}  # request hooks running now
        self._cut: dict[asyncio.Task, str] = {}  # hooks the drain cancelled → why
        self._task: asyncio.Task | None = None
        self._master: Any = None

    # --- signals ---------------------------------------------------------------------------

    def running(self) -> None:
        self._master = ctx.master
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            if sig is signal.SIGINT and hasattr(self._master, "prompt_for_exit"):
                continue  # mitmproxy's console asks before it exits on Ctrl-C: left as it is
            try:
                loop.add_signal_handler(sig, self.signalled, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # no loop signal handlers here (Windows)
                return

    def signalled(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._task is not None:
            logger.warning(
                f"receipt-proxy: {name} again: exiting now; matched requests still in flight stay submitted "
                "and become outcome_unknown at the next start"
            )
            self._master.shutdown()
            return
        self.stopping = True
        timeout = ctx.options.receipts_drain_timeout
        logger.warning(
            f"receipt-proxy: {name}: stopping; waiting up to {timeout}s (receipts_drain_timeout) for "
            f"{self.in_flight()} matched request(s) in flight; new matched writes get 503 not_sent; "
            f"{name} again exits at once"
        )
        self._task = asyncio.get_running_loop().create_task(self._drain(timeout))

    # --- what the hooks addon calls --------------------------------------------------------

    def refuses(self, flow: http.HTTPFlow, meta: dict) -> bool:
        """While stopping: answer a new matched write 503 not_sent, nothing sent, no receipt (True)."""
        if not self.stopping:
            return False
        logger.warning(f"receipt-proxy: {meta['api']} {meta['operation']} NOT forwarded: the proxy is stopping")
        flows.answer(flow, stopping_answer(meta["api"], meta["operation"], "the proxy is stopping"))
        meta["answer"] = "stopping"
        flow.marked = MARKERS[State.NOT_SENT]
        flow.comment = "NOT SENT: the proxy is stopping (no receipt written)"
        return True

    @contextlib.asynccontextmanager
    async def track(self, flow: http.HTTPFlow, meta: dict) -> AsyncIterator[None]:
        """Count a matched flow in flight while its request hook runs (and until it is answered)."""
        task = asyncio.current_task()
        assert task is not None
        if len(self._flows) >= self._prune_at:  # amortized: not a pass over every flow in flight per request
            self._prune()
            self._prune_at = max(PRUNE_AT, 2 * len(self._flows))
        self._flows.add(flow)
        self._hooks[task] = (flow, meta)
        try:
            yield
        except asyncio.CancelledError:
            why = self._cut.pop(task, None)
            if why is None:  # not ours: mitmproxy is exiting (a second signal)
                raise
            task.uncancel()
            self._hooks.pop(task, None)
            await self._answer_cut(flow, meta, why)
        finally:
            self._hooks.pop(task, None)
            self._cut.pop(task, None)

    def follow(self, task: asyncio.Task, flow: http.HTTPFlow, meta: dict) -> None:
        """
        A matched flow's exchange that goes on after its request hook returned (streaming.py: an
        answer passed on as it comes): in flight until `task` ends, and cut at the timeout as a
        hook is; the task itself records what a cut leaves, and ends its agent's answer.
        """
        self._flows.add(flow)
        self._hooks[task] = (flow, meta)
        task.add_done_callback(self._followed)

    def _followed(self, task: asyncio.Task) -> None:
        self._hooks.pop(task, None)
        self._cut.pop(task, None)

    def in_flight(self) -> int:
        """Matched flows not answered yet, and reconcile reads running (an operator's included)."""
        self._prune()
        gate = self.receipts.gate
        return len(self._flows) + (gate.reads_in_progress() if gate is not None else 0)

    # --- the drain -------------------------------------------------------------------------

    async def _drain(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                self._deny_held()
                if not self.in_flight() or loop.time() >= deadline:
                    break
                await asyncio.sleep(POLL)
            if left := self.in_flight():
                why = f"the proxy stopped: receipts_drain_timeout ({timeout:g}s) passed while the request was in flight"
                logger.warning(f"receipt-proxy: {why}: cutting {left} matched request(s) and read(s)")
                self._cut_all(why)
                grace = loop.time() + CUT_GRACE
                while self._flows and loop.time() < grace:
                    await asyncio.sleep(POLL)
                    self._prune()
                logger.warning("receipt-proxy: exiting")
            else:
                logger.warning("receipt-proxy: every matched request in flight has its outcome; exiting")
        finally:
            self._master.shutdown()

    def _pending(self, flow: http.HTTPFlow, running: set[int]) -> bool:
        """A matched flow whose hook still runs, or whose answer has not gone out to a client still there."""
        if id(flow) in running:
            return True
        return flow.live and flow.client_conn.timestamp_end is None

    def _prune(self) -> None:
        running = {id(f) for f, _ in self._hooks.values()}
        self._flows = weakref.WeakSet(f for f in list(self._flows) if self._pending(f, running))

    def _deny_held(self) -> None:
        """Writes held for approval are not sent: cut their hooks (track() records not_sent and answers)."""
        for task, (flow, meta) in list(self._hooks.items()):
            if task not in self._cut and flow.intercepted and meta.get("state") == State.AWAITING_APPROVAL:
                self._cut_hook(task, HELD)

    def _cut_all(self, why: str) -> None:
        for task in list(self._hooks):
            if task not in self._cut:
                self._cut_hook(task, why)
        hooked = {id(f) for f, _ in self._hooks.values()}
        for flow in list(self._flows):  # receipts_forward=mitmproxy: mitmproxy holds the exchange, no hook
            meta = flow.metadata.get(META) or {}
            if id(flow) not in hooked and meta.get("answer") == "forward" and "outcome" not in meta:
                meta["outcome"] = str(State.OUTCOME_UNKNOWN)  # what mitmproxy's error hook then says is not recorded
                asyncio.get_running_loop().create_task(self._cut_forwarded(flow, meta, why))

    def _cut_hook(self, task: asyncio.Task, why: str) -> None:
        self._cut[task] = why
        task.cancel(f"receipt-proxy: {why}")

    # --- recording what a cut leaves -------------------------------------------------------

    async def _answer_cut(self, flow: http.HTTPFlow, meta: dict, why: str) -> None:
        """A request hook the drain cut: record what is known of its receipt, and answer its agent."""
        if flow.intercepted:
            flow.resume()
        operation_id = meta.get("operation_id")
        if operation_id is None or meta.get("answer") != "forward":
            # No write of its own was sent: a duplicate waiting for an original, or a decision in progress.
            flows.answer(flow, stopping_answer(meta["api"], meta["operation"], why))
            flow.marked, flow.comment = MARKERS[State.NOT_SENT], f"NOT SENT: {why}"
            return
        if "outcome" in meta:  # recorded already; what was cut came after (a read the answer asked for)
            if flow.response is None:
                flows.answer(flow, answers.exchange_failed(operation_id, State(meta["outcome"]), why, timed_out=False))
            return
        if meta.get("state") == State.AWAITING_APPROVAL:
            held = await self._not_sent(flow, meta, operation_id, why)
            if held is not None:
                flows.answer(flow, stopping_answer(meta["api"], meta["operation"], why, held))
                return
        await self._record_unknown(flow, meta, operation_id, why)
        flows.answer(
            flow,
            answers.exchange_failed(operation_id, State(meta["state"]), f"outcome unknown: {why}", timed_out=False),
        )

    async def _not_sent(self, flow: http.HTTPFlow, meta: dict, operation_id: str, why: str) -> Receipt | None:
        """A write held for approval when the proxy stops: not_sent (None if it was decided meanwhile)."""
        calls = self.receipts.calls
        assert calls is not None
        try:
            receipt = await calls(
                lambda s: s.transition(
                    operation_id,
                    State.NOT_SENT,
                    reason=why,
                    actor="proxy",
                    expect=[State.AWAITING_APPROVAL],
                    flow_id=flow.id,
                    error=why,
                )
            )
        except StoreError as e:
            logger.warning(f"receipt {operation_id}: could not record not_sent at stop: {e}")
            return None
        meta.update(outcome=str(receipt.state), state=str(receipt.state))
        mark(flow, receipt.state, receipt)
        logger.warning(f"receipt {operation_id}: {why}")
        return receipt

    async def _record_unknown(self, flow: http.HTTPFlow, meta: dict, operation_id: str, why: str) -> None:
        gate = self.receipts.gate
        assert gate is not None
        reason = f"outcome unknown: {why}"
        meta["outcome"] = meta["state"] = str(State.OUTCOME_UNKNOWN)
        receipt = await gate.record(operation_id, Outcome(State.OUTCOME_UNKNOWN, reason, error=reason), flow_id=flow.id)
        if receipt is not None:
            meta["state"] = str(receipt.state)
            mark(flow, receipt.state, receipt)

    async def _cut_forwarded(self, flow: http.HTTPFlow, meta: dict, why: str) -> None:
        """receipts_forward=mitmproxy: record outcome_unknown, then end mitmproxy's upstream exchange."""
        await self._record_unknown(flow, meta, meta["operation_id"], why)
        internals.close_server_connection(flow)
