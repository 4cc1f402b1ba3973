"""
The decisions applied to a receipt, read from its events (no SQL): a rule's deny, a budget's
refusal, a hold for approval and how it ended (approved or denied, by whom: mitmweb, cli:NAME,
link:ADDRESS; or denied by the proxy: no decision in time, the rules changed after the approval,
the write edited while held, the agent gone), what observe mode would have done (receipts_mode=
observe: the would_* events, and `duplicate_sent` on the receipt a duplicate would have been
answered from), a reconcile read's verdict, a resolution by hand. `receipts show`, `receipts
export` (plain and --signed) and mitmweb's Receipt view print them; the events stay the record
(each decision names its event, which the hash chain covers: docs/proof.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxy_addon.states import RESOLUTIONS, State
from proxy_addon.store.decision_reasons import (
    DENIED,
    DENIED_BY_POLICY,
    HUNG_UP,
    MODIFIED,
    OPERATOR,
    OVER_BUDGET,
    RULES_CHANGED,
    TIMED_OUT,
    approver_of,
)
from proxy_addon.store.records import DUPLICATE_SENT, Event

# What observe mode would have done, by its event's kind (store/attempts.py `_would_events`): it was sent.
_WOULD = {
    "would_block": "observe: would have blocked it (a duplicate); sent",
    "would_replay": "observe: would have replayed a recorded answer; sent",
    "would_hold": "observe: would have held it for approval; sent",
    "would_deny": "observe: would have denied it by a rule's decision; sent",
    "would_refuse": "observe: would have refused it (over budget); sent",
}


@dataclass(frozen=True)
class AppliedDecision:
    at: str
    # one word for programs: held, approved, denied, timed_out, rules_changed, modified, hung_up, not_sent,
    # denied_by_rule, over_budget, refused, would_block ... would_refuse, duplicate_sent, reconciled, review, resolved
    kind: str
    decision: str  # what was decided, in a few words
    by: str  # the event's actor: "proxy" (a rule, a budget, the gate), "mitmweb", "cli:NAME", "link:ADDRESS", ...
    why: str  # the event's reason
    event_id: int


def _via(actor: str) -> str:
    """Where an operator decided a held write: mitmweb, `receipts approve` / `deny`, an approval link."""
    if actor == OPERATOR:
        return "in mitmweb"
    if actor.startswith("cli:"):
        return f"by {actor.removeprefix('cli:')} at the command line"
    if actor.startswith("link:"):
        return f"with an approval link (from {actor.removeprefix('link:')})"
    return f"by {actor}"


def _new(e: Event) -> tuple[str, str] | None:
    """A new receipt's first event: held for approval, or refused and never sent (a rule's deny, a budget)."""
    if e.to_state is State.AWAITING_APPROVAL:
        return "held", "held for approval"
    if e.to_state is not State.REJECTED:
        return None
    if e.reason.startswith(DENIED_BY_POLICY):
        return "denied_by_rule", "denied by a rule's decision, never sent"
    if e.reason.startswith(OVER_BUDGET):
        return "over_budget", "refused: over budget, never sent"
    return "refused", "refused, never sent"


def _held_end(e: Event) -> tuple[str, str]:
    """How a write held for approval ended: approved or denied, and by whom, or not sent."""
    if e.to_state is State.SUBMITTED:
        return "approved", f"approved {_via(e.actor)}"
    if e.to_state is not State.REJECTED:
        return "not_sent", f"not sent ({e.to_state}): the proxy stopped while it was held"
    if e.reason.startswith(TIMED_OUT):
        return "timed_out", "denied: no decision within the approval timeout"
    if e.reason.startswith(RULES_CHANGED):
        approver = approver_of(e.reason)
        after = f"{approver} approved it" if approver else "it was approved"
        return "rules_changed", f"denied: the operation's rules changed after {after}"
    if e.reason == MODIFIED:
        return "modified", "denied: the request was modified while held"
    if e.reason == HUNG_UP:
        return "hung_up", "denied: the agent hung up while it was held"
    if e.reason.startswith(DENIED):
        return "denied", f"denied {_via(e.actor)}"
    return "denied", f"denied ({e.actor})"


def _settled(e: Event) -> tuple[str, str] | None:
    """A resolution: a reconcile read's verdict, a receipt taken into review, one resolved by hand."""
    was, to = e.from_state, e.to_state
    if was is State.RECONCILING and to is not State.RECONCILING:
        return "reconciled", f"reconciled with a read: {to}"
    if to is State.MANUAL_REVIEW and e.actor != "proxy":
        return "review", "taken into review"
    if was is State.MANUAL_REVIEW and to in RESOLUTIONS:
        return "resolved", f"resolved by hand as {to}"
    return None


def _decision(e: Event) -> tuple[str, str] | None:
    """(kind, decision) if the event applied a decision; None for the proxy's own steps."""
    if e.event in _WOULD:
        return e.event, _WOULD[e.event]
    if e.event == DUPLICATE_SENT:
        return DUPLICATE_SENT, "observe: a duplicate it would have answered was sent"
    if e.event != "transition":
        return None
    if e.from_state is None:
        return _new(e)
    if e.from_state is State.AWAITING_APPROVAL:
        return _held_end(e)
    return _settled(e)


def applied_decisions(events: Iterable[Event]) -> list[AppliedDecision]:
    """The decisions applied, oldest first."""
    out = []
    for e in events:
        found = _decision(e)
        if found is not None:
            kind, decision = found
            out.append(AppliedDecision(e.at, kind, decision, e.actor, e.reason, e.id))
    return out
