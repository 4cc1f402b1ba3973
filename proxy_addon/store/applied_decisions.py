"""
The decisions applied to a receipt, read from its events (no SQL): a rule's deny or hold for
approval, an operator's approval or denial, a resolution by hand, a reconcile read's verdict.
`receipts show` and `receipts export` print them; the events stay the record (and the hash
chain covers them: docs/proof.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxy_addon.states import RESOLUTIONS, State
from proxy_addon.store.records import Event


@dataclass(frozen=True)
class AppliedDecision:
    at: str
    decision: str  # what was decided, in a few words
    by: str  # the event's actor: "proxy" (a rule), "cli:NAME", an operator's name, a reconcile's actor
    why: str  # the event's reason
    event_id: int


def _decision(e: Event) -> str | None:
    """What a transition event decided, if it applied a decision; None for the proxy's own steps."""
    if e.event != "transition":
        return None
    was, to = e.from_state, e.to_state
    if was is None and to is State.AWAITING_APPROVAL:
        return "held for approval"
    if was is None and to is State.REJECTED:
        return "denied by a rule's decision, never sent"
    if was is State.AWAITING_APPROVAL:
        return "approved" if to is State.SUBMITTED else f"denied ({to})" if to is State.REJECTED else f"not sent ({to})"
    if was is State.RECONCILING and to is not State.RECONCILING:
        return f"reconciled with a read: {to}"
    if to is State.MANUAL_REVIEW and e.actor != "proxy":
        return "taken into review"
    if was is State.MANUAL_REVIEW and to in RESOLUTIONS:
        return f"resolved by hand as {to}"
    return None


def applied_decisions(events: Iterable[Event]) -> list[AppliedDecision]:
    """The decisions applied, oldest first."""
    out = []
    for e in events:
        decision = _decision(e)
        if decision is not None:
            out.append(AppliedDecision(e.at, decision, e.actor, e.reason, e.id))
    return out
