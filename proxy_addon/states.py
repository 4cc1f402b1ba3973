"""
Receipt states and the one table of legal transitions.

    awaiting_approval ─┬─ (approved) submitted
                       └─ rejected (denied by an operator) · not_sent (the proxy stopped)

    submitted ─┬─ succeeded
               ├─ rejected           explicit refusal (4xx)
               ├─ not_sent           provably never left the proxy
               └─ outcome_unknown ───► reconciling ─┬─ succeeded         found
                    │    ▲                          ├─ safe_to_retry     absence proven, a retry allowed
                    │    │                          │
                    │    └──── a failed read ◄──────┤  timeout, TLS, 429, 5xx, an answer that cannot be
                    │          (or settle: absence  │  judged: nothing proven. The next read not before
                    │          provable only later) │  the answer's Retry-After, else 30 s doubling;
                    │                               │  duplicates meanwhile: 409 + Retry-After, no read
                    │                               │
                    └───────► manual_review ◄───────┴─ absence not provable; or the failed read that
                              (a human: succeeded,     was the last allowed: receipts_read_attempts (3)
                              safe_to_retry or         failed, or past receipts_read_deadline (24 h
                              rejected; or a read)     after the outcome became unknown)

    submitted, waiting (no state of its own: the receipt's `waiting_for`, store/rounds.py)
        an MCP tool call whose server answered something that is no outcome, with nothing in flight:
        ── input_required ──► waiting_for "input" ── the client's next round (same receipt) ──► submitted
                                                  ── more than receipts_mcp_rounds, or no round within
                                                     receipts_mcp_input_wait ──► outcome_unknown
        ── a task handle ───► waiting_for "task"  ── the task's end, as the call's answer ──► succeeded,
                                                     rejected, outcome_unknown (outcome/task_ends.py)
        A duplicate meanwhile is blocked at once (never waits); recovery leaves such a receipt as it is.

Every state change in the store is checked against `TRANSITIONS` and guarded in
SQL by the state it leaves, so a change that lost a race fails instead of
overwriting newer knowledge.
"""

from __future__ import annotations

import enum


class State(enum.StrEnum):
    AWAITING_APPROVAL = "awaiting_approval"  # held until an operator decides (mitmweb, receipts approve/deny)
    SUBMITTED = "submitted"
    SUCCEEDED = "succeeded"
    REJECTED = "rejected"
    NOT_SENT = "not_sent"
    OUTCOME_UNKNOWN = "outcome_unknown"
    RECONCILING = "reconciling"
    SAFE_TO_RETRY = "safe_to_retry"
    MANUAL_REVIEW = "manual_review"


# While a fingerprint has a receipt in one of these states, an identical request is blocked.
UNRESOLVED: frozenset[State] = frozenset(
    {State.AWAITING_APPROVAL, State.SUBMITTED, State.OUTCOME_UNKNOWN, State.RECONCILING, State.MANUAL_REVIEW}
)

# A duplicate of a receipt in one of these states is forwarded as a new attempt (retry_of set).
RETRYABLE: frozenset[State] = frozenset({State.REJECTED, State.NOT_SENT, State.SAFE_TO_RETRY})

# States with no way out: the attempt is settled.
TERMINAL: frozenset[State] = frozenset({State.SUCCEEDED, State.REJECTED, State.NOT_SENT, State.SAFE_TO_RETRY})

# What a human may decide a receipt under review is (`receipts resolve --as ...`).
RESOLUTIONS: tuple[State, ...] = (State.SUCCEEDED, State.SAFE_TO_RETRY, State.REJECTED)

TRANSITIONS: dict[State, frozenset[State]] = {
    # approved → sent; denied by the operator or timed out → rejected; the proxy stopped → not sent
    State.AWAITING_APPROVAL: frozenset({State.SUBMITTED, State.REJECTED, State.NOT_SENT}),
    State.SUBMITTED: frozenset({State.SUCCEEDED, State.REJECTED, State.NOT_SENT, State.OUTCOME_UNKNOWN}),
    # a read claims it (reconciling); a human takes it into review
    State.OUTCOME_UNKNOWN: frozenset({State.RECONCILING, State.MANUAL_REVIEW}),
    # found → succeeded; absence proven → safe_to_retry; absence not provable, or a failed read that
    # was the last one allowed (attempts, deadline) → manual_review; a failed read before that, or a
    # read before its settle delay → outcome_unknown again, waiting for the next read (failed_reads,
    # next_read_at)
    State.RECONCILING: frozenset({State.SUCCEEDED, State.SAFE_TO_RETRY, State.MANUAL_REVIEW, State.OUTCOME_UNKNOWN}),
    # resolved by hand, or read again (receipts reconcile): a failed read leaves it in manual_review
    State.MANUAL_REVIEW: frozenset({State.RECONCILING, State.SUCCEEDED, State.SAFE_TO_RETRY, State.REJECTED}),
    State.SUCCEEDED: frozenset(),
    State.REJECTED: frozenset(),
    State.NOT_SENT: frozenset(),
    State.SAFE_TO_RETRY: frozenset(),
}


def sources_of(target: State) -> frozenset[State]:
    """The states from which `target` may be reached."""
    return frozenset(s for s, targets in TRANSITIONS.items() if target in targets)


def is_legal(source: State, target: State) -> bool:
    return target in TRANSITIONS[source]
