"""
The approval gate (`approve: true` in a rule): a write waits for an operator, in mitmweb or
at a terminal.

The request is held with mitmproxy's own intercept until an operator decides, or until
receipts_approval_timeout passes (denied). An operator decides in mitmweb (Resume: approved,
the receipt becomes submitted and the request is sent; Abort, mitmproxy's kill: denied,
rejected "denied by operator"), or from another process with `receipts approve ID` /
`receipts deny ID --note ...` or an approval link, which record the decision in the store
(`decide_approval`).
`Approvals` looks for such decisions every POLL seconds while this proxy holds a write, and
the held write applies one exactly as a Resume or an Abort, marking the decision used in the
transaction that moves the receipt (`apply_approval`); the event names the decider (cli:NAME)
and carries the note. A decision applies only to the intent it was made on (its fingerprint).
The agent gets a 403 that says so when denied. The wait holds no thread.

A held write is sent as it was recorded, or not at all:
- mitmweb lets an operator edit a held flow (`PUT /flows/<id>`, the command bar's `flow.set`).
  What goes upstream (method, URL, headers, body, trailers) is taken when the flow is held and
  compared when it is resumed: a write edited while held is denied ("modified while held"),
  since its receipt, fingerprint and duplicate check are the original's. An edit undone
  (mitmweb's Revert) before the resume is no edit. We compare the request itself rather than
  trust `flow.modified()`: mitmweb backs a flow up on any edit, a comment or a marker too, and
  our own markers change the flow after that backup.
- An agent that hangs up while its write is held (its connection closed, as mitmproxy sees it:
  `client_conn.connected` is false) gets its write denied at once ("the agent hung up while the
  write was held"), also when an operator resumes it later: nobody would get the answer. An
  HTTP/2 stream reset on a connection that stays open is not seen: the timeout or an operator
  decides that write.
- mitmweb's "Resume all" resumes every held flow, each one approved as if resumed by itself.
- Two operators at once (mitmweb and the CLI): whichever this proxy sees first is applied, and
  the store's guarded transition (`awaiting_approval` → ...) lets only one through. The CLI's
  decision that lost stays unused, and `receipts approve` says so. An edit or a hang-up beats a
  decision from the CLI as it beats a Resume: denied, the decision unused.
- An approval binds to the rules: the version of the operation's rules (rules/policy_version.py)
  is taken when the write is held, and an approval (mitmweb's, the CLI's, a link's, which also
  names the version it was given under) releases it only while the rules in force still have
  it. Otherwise the write is denied ("the operation's rules changed while the write was held"),
  the approval left unused; a denial stands under any rules.
- The timeout is a denial: `rejected` (nothing was sent), "denied: no decision within
  receipts_approval_timeout (Ns)", by `proxy`. Who decided otherwise is the event's actor:
  `mitmweb`, `cli:NAME`, `link:ADDRESS` (mitm/approval_server.py).
- `Approvals.notify` (mitm/approval_webhook.py) is told of each write as it is held.
The flow's comment keeps `AWAITING APPROVAL` while it is held (flows.comment), and says why a
denied write was denied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from mitmproxy import ctx, hooks, http
from mitmproxy.flow import Error

from proxy_addon.errors import StoreError
from proxy_addon.gate.metrics import Metrics
from proxy_addon.gate.store_thread import StoreThread
from proxy_addon.mitm import flows
from proxy_addon.mitm.flows import HELD, META, mark
from proxy_addon.outcome import http_answers as answers
from proxy_addon.states import State
from proxy_addon.store import ApprovalDecision, Receipt, utcnow
from proxy_addon.store.decision_reasons import (  # OPERATOR: the actor of mitmweb's Resume and Abort
    APPROVED,
    DENIED,
    HUNG_UP,
    MODIFIED,
    OPERATOR,
    RULES_CHANGED,
    TIMED_OUT,
    rules_changed,
)

logger = logging.getLogger(__name__)

POLL = 0.5  # seconds between two looks for decisions from the CLI, while a write is held
TICK = 0.25  # seconds between two looks at a held flow (killed? agent gone? past the timeout?)

_TIMES = ("timestamp_start", "timestamp_end")  # when it arrived: not part of what is sent


@dataclass
class _Held:
    """A write this proxy holds, and the decision from the CLI found for it."""

    receipt: Receipt
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    decision: ApprovalDecision | None = None
    refused: bool = False  # a decision for another intent was found (and said, once)

    def offer(self, d: ApprovalDecision) -> None:
        if d.intent_fingerprint != self.receipt.intent_fingerprint:
            if not self.refused:
                self.refused = True
                logger.error(
                    f"receipt {d.operation_id}: the decision {d.decision} by {d.actor} is for the intent "
                    f"{d.intent_fingerprint}, not the held write's {self.receipt.intent_fingerprint}: not applied"
                )
            return
        self.decision = d
        self.woken.set()


Notify = Callable[[Receipt, datetime, str], None]  # a held write, when its approval expires, its rules' version


class Approvals:
    """
    The writes this proxy holds for approval, and the decisions recorded for them from another
    process (`receipts approve` / `deny`, an approval link): one query every POLL seconds while
    any write is held, none otherwise. `notify`, when set (mitm/approval_webhook.py), is told of
    each write as it is held; it must not block.
    """

    def __init__(self, calls: Callable[[], StoreThread | None]):
        self._calls = calls
        self.notify: Notify | None = None
        self._held: dict[str, _Held] = {}
        self._task: asyncio.Task | None = None
        self._failing: str | None = None  # the last error of a look, said once

    @contextlib.contextmanager
    def holding(self, receipt: Receipt) -> Iterator[_Held]:
        held = self._held[receipt.operation_id] = _Held(receipt)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())
        try:
            yield held
        finally:
            self._held.pop(receipt.operation_id, None)

    async def _watch(self) -> None:
        while self._held:
            await asyncio.sleep(POLL)
            await self.look()

    async def look(self) -> None:
        """Hand each held write the decision recorded for it, if any."""
        calls, ids = self._calls(), list(self._held)
        if calls is None or not ids:
            return
        try:
            found: dict[str, ApprovalDecision] = await calls(lambda s: s.approval_decisions(ids))
        except Exception as e:  # a store error, or any surprise: the looks go on, and say it once
            why = str(e) if isinstance(e, StoreError) else f"{type(e).__name__}: {e}"
            if why != self._failing:
                logger.warning(f"receipt-proxy: could not look for approval decisions: {why}")
            self._failing = why
            return
        self._failing = None
        for operation_id, d in found.items():
            if (held := self._held.get(operation_id)) is not None:
                held.offer(d)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _sent_form(req: http.Request) -> dict[str, Any]:
    """What of a request goes upstream: all of it (target, version, headers, body, trailers) but its timestamps."""
    state = req.get_state()
    for k in _TIMES:
        state.pop(k, None)
    return state


def _killed(flow: http.HTTPFlow) -> bool:
    return flow.error is not None and flow.error.msg == Error.KILLED_MESSAGE


def _gone(flow: http.HTTPFlow) -> bool:
    return not flow.client_conn.connected


async def _tick(flow: http.HTTPFlow, held: _Held) -> None:
    """Wait for a resume, a decision from the CLI, or TICK seconds."""
    waits = [asyncio.ensure_future(flow.wait_for_resume()), asyncio.ensure_future(held.woken.wait())]
    try:
        await asyncio.wait(waits, timeout=TICK, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def _operator_reason(d: ApprovalDecision) -> str:
    said = f": {d.note}" if d.note else ""
    return f"{APPROVED}{said}" if d.approved else f"{DENIED}{said}"


async def _decision(
    flow: http.HTTPFlow, held_as: dict[str, Any], timeout: float, held: _Held
) -> tuple[State, str, str, ApprovalDecision | None]:
    """Wait for the decision: (the receipt's next state, why, who decided, the CLI's decision if it is the one)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (
        flow.intercepted and not _killed(flow) and not _gone(flow) and held.decision is None and loop.time() < deadline
    ):
        await _tick(flow, held)
    if _killed(flow):
        return State.REJECTED, DENIED, OPERATOR, None
    if _gone(flow):  # before a resume is taken: nobody would get the answer
        return State.REJECTED, HUNG_UP, "proxy", None
    if (d := held.decision) is not None:
        if _sent_form(flow.request) != held_as:
            return State.REJECTED, MODIFIED, "proxy", None
        flow.resume()  # out of mitmproxy's intercept, as a Resume would
        return (State.SUBMITTED if d.approved else State.REJECTED), _operator_reason(d), d.actor, d
    if not flow.intercepted:
        if _sent_form(flow.request) != held_as:
            return State.REJECTED, MODIFIED, "proxy", None
        return State.SUBMITTED, APPROVED, OPERATOR, None
    return State.REJECTED, f"{TIMED_OUT} ({timeout:g}s)", "proxy", None


def _under_the_rules(
    decided: tuple[State, str, str, ApprovalDecision | None], version: str, policy: Callable[[], str | None]
) -> tuple[State, str, str, ApprovalDecision | None]:
    """
    An approval releases the write only under the rules it was held under: the rules' version
    now (`policy`) and the one the approval was given under (a link's) must both be `version`.
    Otherwise it is denied, and the approval is left unused. A denial stands under any rules.
    """
    to, _, approver, by_cli = decided
    if to is not State.SUBMITTED:
        return decided
    now, given = policy(), (by_cli.rules_version if by_cli is not None else None) or version
    if now == version == given:
        return decided
    return State.REJECTED, rules_changed(given, approver, now), "proxy", None


def decision_label(to: State, reason: str, by_cli: ApprovalDecision | None) -> str:
    """The `decision` label of receipt_proxy_approval_decisions_total."""
    if to is State.SUBMITTED:
        return "approved"
    if by_cli is not None or reason == DENIED:
        return "denied"
    if reason.startswith(RULES_CHANGED):
        return "rules_changed"
    return {MODIFIED: "modified", HUNG_UP: "hung_up"}.get(reason, "timeout")


def _notify(approvals: Approvals, receipt: Receipt, expires_at: datetime, version: str) -> None:
    """Tell the webhook (it sends on a task of its own); a failure to do so is logged, the write stays held."""
    if approvals.notify is None:
        return
    try:
        approvals.notify(receipt, expires_at, version)
    except Exception:
        logger.exception(f"receipt {receipt.operation_id}: the approval webhook could not be sent")


async def await_approval(
    flow: http.HTTPFlow,
    meta: dict,
    receipt: Receipt,
    calls: StoreThread,
    timeout: float,
    approvals: Approvals,
    *,
    metrics: Metrics,
    policy: Callable[[], str | None],
) -> Receipt:
    """
    Hold the flow until an operator decides; the receipt after the decision (submitted: send it).
    `policy`: the version of the operation's rules in force (rules/policy_version.py), None if it is gone.
    """
    held_as = _sent_form(flow.request)  # what the receipt recorded: sent so, or not at all
    version = policy() or "none"
    flow.intercept()
    mark(flow, State.AWAITING_APPROVAL, receipt, prefix=HELD)
    ctx.master.addons.trigger(hooks.UpdateHook([flow]))
    logger.warning(
        f"receipt {receipt.operation_id} {receipt.api} {receipt.operation}: awaiting approval "
        f"(mitmweb, or receipts approve/deny {receipt.operation_id})"
    )
    metrics.held(receipt.api, receipt.operation, 1)
    _notify(approvals, receipt, utcnow() + timedelta(seconds=timeout), version)
    try:
        with approvals.holding(receipt) as held:
            decided = await _decision(flow, held_as, timeout, held)
            to, reason, actor, by_cli = _under_the_rules(decided, version, policy)
    except asyncio.CancelledError:  # the proxy stops (drain.py records not_sent)
        metrics.decided(receipt.api, receipt.operation, "stopped")
        raise
    finally:
        metrics.held(receipt.api, receipt.operation, -1)
    metrics.decided(receipt.api, receipt.operation, decision_label(to, reason, by_cli))
    receipt = await _record_decision(flow, receipt, calls, to, reason, actor, by_cli)
    _go_on(flow, meta, receipt, held_as, to, reason, by_cli)
    return receipt


async def _record_decision(
    flow: http.HTTPFlow,
    receipt: Receipt,
    calls: StoreThread,
    to: State,
    reason: str,
    actor: str,
    by_cli: ApprovalDecision | None,
) -> Receipt:
    """The decision committed: a CLI's recorded decision applied, or the receipt moved on (submitted, rejected)."""
    if by_cli is not None:  # used in the transaction that moves the receipt
        return await calls(
            lambda s: s.apply_approval(by_cli, fingerprint=receipt.intent_fingerprint, reason=reason, flow_id=flow.id)
        )
    fields = {} if to is State.SUBMITTED else {"error": reason}
    return await calls(
        lambda s: s.transition(
            receipt.operation_id,
            to,
            reason=reason,
            actor=actor,
            expect=[State.AWAITING_APPROVAL],
            flow_id=flow.id,
            **fields,
        )
    )


def _go_on(
    flow: http.HTTPFlow,
    meta: dict,
    receipt: Receipt,
    held_as: dict[str, Any],
    to: State,
    reason: str,
    by_cli: ApprovalDecision | None,
) -> None:
    """The flow after the decision: approved, sent as recorded; denied, answered 403 (even if it was killed)."""
    if flow.metadata.get(META) is not meta:  # mitmweb's Revert put back a copy of the flow's metadata
        flow.metadata[META] = meta
    meta["state"] = str(receipt.state)
    if receipt.state is State.SUBMITTED and _sent_form(flow.request) != held_as:
        # Edited after the resume, while the approval was being committed: the flow is no longer
        # held, and what was recorded and approved is what is sent.
        flow.request.set_state({**flow.request.get_state(), **held_as})
        logger.warning(f"receipt {receipt.operation_id}: an edit made after the approval was undone; sent as recorded")
    mark(flow, receipt.state, receipt)
    if to is not State.SUBMITTED:
        meta["outcome"], meta["answer"] = str(to), "denied"
        # Answer the agent even when the flow was killed: undo the kill, send a 403 that says why.
        flow.error, flow.live, flow.intercepted = None, True, False
        flows.answer(flow, answers.denied(receipt, reason))
        logger.warning(f"receipt {receipt.operation_id}: {reason}")
    elif by_cli is not None:
        logger.warning(f"receipt {receipt.operation_id}: {reason} ({by_cli.actor})")
    ctx.master.addons.trigger(hooks.UpdateHook([flow]))
