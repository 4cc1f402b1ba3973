"""
The reasons that events record for decisions, written by store/attempts.py (a new receipt refused,
never sent) and mitm/approval.py (a held write's end), read by store/applied_decisions.py, which
tells the decisions apart by them. One place, so that the writers and the reader cannot drift.
"""

from __future__ import annotations

# A new receipt recorded rejected and never sent (attempts.py `_refusal`): "denied by policy <rule>",
# "over budget: <budget>".
DENIED_BY_POLICY = "denied by policy "
OVER_BUDGET = "over budget: "

# A write held for approval (mitm/approval.py): who decided is the event's actor (OPERATOR for
# mitmweb's Resume and Abort, cli:NAME, link:ADDRESS), or `proxy` for the denials it makes itself.
OPERATOR = "mitmweb"
APPROVED = "approved by operator"  # ": <note>" after it when the decision has one
DENIED = "denied by operator"  # ": <note>" likewise
MODIFIED = "denied: the request was modified while held (resume it unedited, or revert it first)"
HUNG_UP = "denied: the agent hung up while the write was held"
RULES_CHANGED = "denied: the operation's rules changed while the write was held"
TIMED_OUT = "denied: no decision within receipts_approval_timeout"  # " (300s)" after it


def rules_changed(given: str, approver: str, now: str | None) -> str:
    """An approval that no longer releases the write: who gave it, under which rules, and the rules now."""
    return (
        f"{RULES_CHANGED} (approved under {given} by {approver}, now {now or 'no such operation'}); "
        "send it again to decide anew"
    )


def approver_of(reason: str) -> str | None:
    """Who gave the approval a RULES_CHANGED denial names (`rules_changed`); None if it does not (older versions)."""
    _, found, rest = reason.partition(" by ")
    return rest.split(", now ", 1)[0] if found and reason.startswith(RULES_CHANGED) and ", now " in rest else None
