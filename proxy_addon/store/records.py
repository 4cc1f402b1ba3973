"""
What the store reads and writes, as plain values: an attempt before it is sent, a receipt,
its events, the decision `begin_attempt` takes, an operator's decision on a held write, and
the time helpers. No SQL here.

`Receipt.from_row`, `Event.from_row` and `ApprovalDecision.from_row` turn a row (a dict of column → value, as every
backend's `_rows` returns it) into a value, and refuse a state they do not know.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy_addon.errors import StoreError
from proxy_addon.states import UNRESOLVED, State

Clock = Callable[[], dt.datetime]
# Events of observe mode (receipts_mode=observe, store/attempts.py `_observed`), on the receipt sent in
# enforcement's stead: what enforcement would have done (`would_refuse`: over a budget).
WOULD_HAVE = ("would_block", "would_replay", "would_hold", "would_deny", "would_refuse")
# On the earlier receipt a duplicate would have been answered from: that it was sent all the same.
DUPLICATE_SENT = "duplicate_sent"
DecisionKind = Literal["forward", "blocked", "replay", "blocked_succeeded", "key_conflict", "denied", "over_budget"]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(t: dt.datetime) -> str:
    """`2026-08-16T01:20:30.123456Z` (isoformat, a few times faster than strftime)."""
    return t.astimezone(dt.UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def new_operation_id(now: dt.datetime) -> str:
    """Time-sortable: `20260816T012030Z-1fd54b31a2`."""
    day, _, time = now.astimezone(dt.UTC).replace(tzinfo=None).isoformat(timespec="seconds").partition("T")
    return f"{day.replace('-', '')}T{time.replace(':', '')}Z-{secrets.token_hex(5)}"


def state_of(value: Any, what: str) -> State:
    """A state read from the database; StoreError naming `what` for one this version does not know."""
    try:
        return State(value)
    except ValueError:
        raise StoreError(f"{what} has unknown state {value!r}") from None


@dataclass(frozen=True)
class Charge:
    """
    What a new write takes of one budget (intent/budget_charges.py), counted by store/budgets.py: `amount`
    (1, or the summed field's value) of the budget named `key` (its api, operation, place, window and
    measure) for `principal` ("" for a budget per operation), whose windows are `window` seconds, at most `limit`.
    """

    key: str
    amount: float
    window: int
    limit: float
    what: str  # how messages name it: `test-api things.create budget[0]: 20 writes per 1h per principal`
    principal: str = ""

    @property
    def lock(self) -> str:
        """The name its decisions are serialized under (postgres.py: an advisory lock, as an intent's)."""
        return f"budget:{self.key}|{self.principal}"


@dataclass(frozen=True)
class Attempt:
    """What the proxy knows about a matched request before it is sent."""

    api: str
    operation: str
    method: str
    target: str
    intent_fingerprint: str
    intent: dict[str, Any]
    principal: str
    flow_id: str | None = None
    instance: str | None = None
    client_key: str | None = None  # keyed hash of the agent's own Idempotency-Key and principal
    idempotency: bool = False  # the operation's API deduplicates by an idempotency key we add
    key_format: str = "receipt"  # our key: receipt-<receipt id>, or uuid4
    # the agent's own id in the body (idempotency_key.body): the key of a new attempt; a retry
    # that continues an earlier one (store/attempts.py `continues`) is sent with that one's key
    given_key: str | None = None
    approval: bool = False  # held for an operator's approval before it is sent
    denied: str | None = None  # a `deny` decision (intent/decisions.py), why: recorded rejected, never sent
    decided: str | None = None  # what the operation's `decisions:` decided (allow, approve, deny); None: it has none
    raw_target: str | None = None  # the target as sent, when it is not the canonical `target`
    fingerprint_scheme: int | None = None  # the scheme that made `intent_fingerprint` (fingerprint.SCHEME)
    fingerprint_rule: str | None = None  # the digest of the rule it read (Operation.rule_digest)
    # The same request's fingerprints under the earlier schemes and rules its intent's receipts were
    # made with (intent/earlier_fingerprints.py): a receipt with one of `earlier` is this intent's in any
    # state; one with one of `earlier_unresolved` only while it is unresolved (an edited rule).
    earlier: tuple[str, ...] = ()
    earlier_unresolved: tuple[str, ...] = ()
    # Fingerprints under which a success is never replayed to this request (a duplicate of it is
    # blocked instead): every one, when nothing tells its caller apart; an earlier scheme's that
    # did not count some credential it carries (intent/caller.py). The receipt may be another caller's.
    unreplayable: tuple[str, ...] = ()
    # The principal of the credential headers alone (fingerprint.principal), when more made
    # `principal` (a key in the query, body or path): what a read, which sends headers only, can match.
    read_principal: str | None = None

    @property
    def fingerprints(self) -> tuple[str, ...]:
        """Every fingerprint this request's intent may have been recorded under, today's first."""
        return (self.intent_fingerprint, *self.earlier, *self.earlier_unresolved)

    upstream_timeout: float | None = None  # receipts_upstream_timeout of the proxy that sends it (its lifetime)
    # An MCP tool call that carries `requestState`/`inputResponses`: the next round of a call whose
    # server asked for input (store/rounds.py); sent under that call's receipt while it waits for it.
    continues: bool = False
    mcp_rounds: int = 10  # receipts_mcp_rounds: the most times a call's server may ask for input
    # receipts_mode=observe (store/attempts.py `_observed`): every decision is recorded, none enforced: a
    # duplicate, a hold, a deny is sent as a new receipt whose events say what enforcement would have done.
    observe: bool = False
    approval_why: str | None = None  # why it is held for approval (`approve: true`, or a decision's rule)
    # The W3C traceparent of the proxy's span for this request (receipts_otel), recorded on a new receipt so
    # that its later changes link to it (gate/receipt_spans.py); None: no span (OpenTelemetry off).
    trace_parent: str | None = None
    # What a new receipt of it takes of its operation's budgets (store/budgets.py); none for a denied one.
    charges: tuple[Charge, ...] = ()


@dataclass(frozen=True)
class Interim:
    """
    An answer that is not the write's outcome (store/rounds.py): the server asks the client for
    input before it goes on (MCP `input_required`), or runs the call as a task (a task handle).
    `task_id` is the server's id of the task: sealed when stored, never logged.
    """

    kind: Literal["input_required", "task"]
    reason: str
    task_id: str | None = field(default=None, repr=False)
    task_status: str | None = None  # working, input_required, ... (as the handle says)
    task_revision: str | None = None  # the MCP revision of the task: "2026-07-28" (the Tasks extension) or "2025-11-25"
    task_ttl: float | None = None  # seconds the server keeps the task (its ttl), if it says: then it may discard it


@dataclass(frozen=True)
class RecordedResponse:
    """An upstream answer kept for replay, in clear: sealed into its receipt (sealing.py), opened to replay."""

    status: int
    headers: list[tuple[str, str]] = field(repr=False)
    body: bytes = field(repr=False)
    truncated: bool = False


@dataclass(frozen=True)
class StoredAnswer:
    """
    A receipt's recorded answer as the database keeps it: its status, size and whether it was
    cut at receipts_response_cap in clear; its headers and body sealed (`encryption`, `sealed`:
    sealing.py), opened only to replay. `clear`: an answer recorded in clear by a version before
    answers were sealed (the row has no response_encryption); it replays as it is.
    """

    status: int
    truncated: bool
    size: int  # bytes kept of it (its body; sealed: the ciphertext with the headers)
    encryption: str | None = None  # the sealing scheme ("v1"); None: recorded in clear
    sealed: bytes = field(default=b"", repr=False)
    clear: RecordedResponse | None = field(default=None, repr=False)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> StoredAnswer | None:
        """The answer a receipt row keeps (sealed: its status is `http_status`, sealing.py), or None."""
        encryption = row.get("response_encryption")
        if encryption is None and row.get("response_status") is None:
            return None
        truncated = bool(row["response_truncated"])
        body = bytes(row["response_body"] or b"")  # bytes from SQLite; a memoryview from some drivers
        if encryption is not None:
            return cls(int(row["http_status"] or 0), truncated, len(body), encryption, sealed=body)
        status = row["response_status"]
        headers = [(str(k), str(v)) for k, v in json.loads(row["response_headers"] or "[]")]
        return cls(status, truncated, len(body), clear=RecordedResponse(status, headers, body, truncated))


@dataclass(frozen=True)
class Receipt:
    operation_id: str
    api: str
    operation: str
    method: str
    target: str
    state: State
    intent_fingerprint: str
    intent: dict[str, Any]
    principal: str
    submitted_at: str
    updated_at: str
    completed_at: str | None
    http_status: int | None
    error: str | None
    external_id: str | None
    flow_id: str | None
    retry_of: str | None
    instance: str | None
    response: StoredAnswer | None = field(default=None, repr=False)  # its headers and body sealed (sealing.py)
    idempotency_key: str | None = None
    client_key: str | None = None
    idempotency_key_at: str | None = None  # when this key was first sent (by this receipt or one it retries)
    raw_target: str | None = None  # the target as sent (redacted like `target`), when it is not the canonical one
    failed_reads: int = 0  # reconcile reads of this receipt that failed and proved nothing
    next_read_at: str | None = None  # outcome_unknown: no read is tried before this time (a failed read, settle)
    fingerprint_scheme: int | None = None  # the scheme that made its fingerprint; None: before schemes were recorded
    fingerprint_rule: str | None = None  # the digest of the rule its fingerprint read; None: not recorded
    read_principal: str | None = None  # its credential headers' principal, when not `principal` (Attempt)
    upstream_timeout: float | None = None  # the sending proxy's receipts_upstream_timeout (None: an earlier version)
    in_flight_until: str | None = None  # submitted + upstream_timeout: the latest its proxy holds the request open
    # Submitted with nothing in flight (store/rounds.py): "input" (its server asked the client for
    # input), "task" (its server runs it as a task); None otherwise.
    waiting_for: str | None = None
    mcp_rounds: int = 0  # how many times its server asked for input (MCP input_required answers)
    # waiting for input: past this, the call is taken as abandoned; for a task: its server may have
    # discarded it (its ttl), so a read of it that fails then settles it outcome_unknown
    waiting_until: str | None = None
    task_hint: str | None = None  # the first characters of its task's id, to tell it by (the id is sealed)
    task_status: str | None = None  # its task's status, as last seen
    task_revision: str | None = None  # the MCP revision its task was created in
    # Sent in observe mode (receipts_mode=observe) though enforcement would have answered it from this
    # earlier receipt (blocked or replayed): that receipt's id. None: a write enforcement sends too.
    shadow_of: str | None = None
    trace_parent: str | None = None  # its span's W3C traceparent (Attempt.trace_parent); None: no span was made

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Receipt:
        state = state_of(row["state"], f"receipt {row['operation_id']}")
        response = StoredAnswer.from_row(row)
        return cls(
            operation_id=row["operation_id"],
            api=row["api"],
            operation=row["operation"],
            method=row["method"],
            target=row["target"],
            state=state,
            intent_fingerprint=row["intent_fingerprint"],
            intent=json.loads(row["intent"]),
            principal=row["principal"],
            submitted_at=row["submitted_at"],
            updated_at=row["updated_at"],
            completed_at=row["completed_at"],
            http_status=row["http_status"],
            error=row["error"],
            external_id=row["external_id"],
            flow_id=row["flow_id"],
            retry_of=row["retry_of"],
            instance=row["instance"],
            response=response,
            idempotency_key=row.get("idempotency_key"),
            client_key=row.get("client_key"),
            idempotency_key_at=row.get("idempotency_key_at"),
            raw_target=row.get("raw_target"),
            failed_reads=row.get("failed_reads") or 0,
            next_read_at=row.get("next_read_at"),
            fingerprint_scheme=row.get("fingerprint_scheme"),
            fingerprint_rule=row.get("fingerprint_rule"),
            read_principal=row.get("read_principal"),
            upstream_timeout=row.get("upstream_timeout"),
            in_flight_until=row.get("in_flight_until"),
            waiting_for=row.get("waiting_for"),
            mcp_rounds=row.get("mcp_rounds") or 0,
            waiting_until=row.get("waiting_until"),
            task_hint=row.get("task_hint"),
            task_status=row.get("task_status"),
            task_revision=row.get("task_revision"),
            shadow_of=row.get("shadow_of"),
            trace_parent=row.get("trace_parent"),
        )

    @property
    def unresolved(self) -> bool:
        return self.state in UNRESOLVED


@dataclass(frozen=True)
class Event:
    id: int
    operation_id: str
    at: str
    event: str  # "transition", "blocked", "replayed", ... and in observe mode one of WOULD_HAVE
    from_state: State | None
    to_state: State
    reason: str
    actor: str
    flow_id: str | None

    @classmethod
    def from_row(cls, r: dict[str, Any]) -> Event:
        what = f"event {r['id']} of receipt {r['operation_id']}"
        return cls(
            id=r["id"],
            operation_id=r["operation_id"],
            at=r["at"],
            event=r["event"],
            from_state=state_of(r["from_state"], what) if r["from_state"] else None,
            to_state=state_of(r["to_state"], what),
            reason=r["reason"],
            actor=r["actor"],
            flow_id=r["flow_id"],
        )


@dataclass(frozen=True)
class Decision:
    """What to do with an attempt: forward it (a new receipt) or answer from an existing one."""

    kind: DecisionKind
    receipt: Receipt
    reason: str = ""  # for a duplicate: why it gets this answer (recorded in the receipt's events)
    answer: RecordedResponse | None = field(default=None, repr=False)  # "replay": the recorded answer, opened
    # "blocked" on a receipt that waits for its task: the task's id, opened for this duplicate (its own
    # caller: never for one the proxy cannot tell from the first, Attempt.unreplayable)
    task_id: str | None = field(default=None, repr=False)
    note: str | None = None  # what the duplicate's answer must say beyond the receipt's state (store/rounds.py)
    retry_after: int | None = None  # "over_budget": seconds until the full budget's window turns
    # "forward" in observe mode (receipts_mode=observe): what enforcement would have done instead, each
    # as its event's kind (WOULD_HAVE: would_block, would_replay, would_hold, would_deny); () otherwise
    would: tuple[str, ...] = ()


@dataclass(frozen=True)
class Example:
    """One event `ReceiptReads.enforcement_since` shows: the receipt it is on, when, and why."""

    operation_id: str
    at: str
    reason: str


@dataclass(frozen=True)
class Enforcement:
    """
    What enforcement did, or in observe mode would have done, in a time (`ReceiptReads.enforcement_since`):
    `writes` {(api, operation): receipts written}; `counts` {(api, operation, kind): n}, where kind is
    blocked, replayed, held, denied (done) or one of WOULD_HAVE; `examples`: the newest of each kind.
    """

    writes: dict[tuple[str, str], int]
    counts: dict[tuple[str, str, str], int]
    examples: list[tuple[str, str, str, Example]]


@dataclass(frozen=True)
class ApprovalDecision:
    """
    An operator's decision on a write held for approval (`receipts approve` / `receipts deny`),
    recorded for the proxy that holds the write to apply. It binds to the receipt, to its
    intent fingerprint and (from a link) to the rules' version it was given under, and is used
    once: `consumed_at` is set in the transaction that moves the receipt on.
    """

    operation_id: str
    intent_fingerprint: str
    decision: Literal["approved", "denied"]
    note: str
    actor: str
    decided_at: str
    consumed_at: str | None = None
    rules_version: str | None = None  # policy_version it was given under; None: the held write's own (the CLI)
    link: str | None = None  # the id of the approval link that decided (gate/approval_links.py); None: no link

    @property
    def approved(self) -> bool:
        return self.decision == "approved"

    @classmethod
    def from_row(cls, r: dict[str, Any]) -> ApprovalDecision:
        if r["decision"] not in ("approved", "denied"):
            what = f"the decision on receipt {r['operation_id']}"
            raise StoreError(f"{what} is {r['decision']!r}, not approved or denied")
        return cls(
            operation_id=r["operation_id"],
            intent_fingerprint=r["intent_fingerprint"],
            decision=r["decision"],
            note=r["note"],
            actor=r["actor"],
            decided_at=r["decided_at"],
            consumed_at=r["consumed_at"],
            rules_version=r.get("rules_version"),
            link=r.get("link"),
        )
