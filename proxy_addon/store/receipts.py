"""
The receipts logic every backend shares: deciding an attempt, guarded transitions,
resolving by hand, operators' decisions on held writes, claiming for reconciliation,
pruning and recovery.

    store = Store.open("receipts.db")
    decision = store.begin_attempt(attempt)      # committed before it returns
    if decision.kind == "forward":
        ...send once...
        store.transition(decision.receipt.operation_id, State.SUCCEEDED, reason="HTTP 201")

Every write runs in one `_write()` transaction of the backend (base.py says what it guarantees).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from proxy_addon.errors import IllegalTransition, StoreError, StoreUnavailable, UnknownReceipt
from proxy_addon.states import RESOLUTIONS, RETRYABLE, TERMINAL, TRANSITIONS, UNRESOLVED, State, sources_of
from proxy_addon.store.base import UniqueViolation, marks
from proxy_addon.store.reads import ReceiptReads
from proxy_addon.store.records import ApprovalDecision, Attempt, Decision, Receipt, iso, new_operation_id

_RECEIPT_COLUMNS = (
    "operation_id",
    "api",
    "operation",
    "method",
    "target",
    "state",
    "intent_fingerprint",
    "intent",
    "principal",
    "submitted_at",
    "updated_at",
    "flow_id",
    "retry_of",
    "instance",
    "idempotency_key",
    "client_key",
    "idempotency_key_at",
    "raw_target",
)
_UPDATABLE = frozenset(
    {"completed_at", "http_status", "error", "external_id", "response", "failed_reads", "next_read_at"}
)
_EVENT_INSERT = (
    "INSERT INTO receipt_events (operation_id, at, event, from_state, to_state, reason, actor, flow_id) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_CHUNK = 500  # ids per DELETE in `prune` (under every driver's parameter limit)

logger = logging.getLogger(__name__)

# Told of each state change the store commits: (api, operation, the state left (None: a new receipt), the state entered)
Observer = Callable[[str, str, State | None, State], None]


class _NeedsDurable(Exception):
    """A transaction begun as not durable was about to insert a receipt: rolled back, begun again durably."""


class ReceiptStore(ReceiptReads):
    """The receipts store over a backend's primitives. A backend subclasses it (sqlite.py)."""

    observer: Observer | None = None  # the proxy's metrics (metrics.py): every state change, once committed
    _told: list[tuple[str, str, State | None, State]] | None = None  # the open transaction's state changes

    def _changed(self, api: str, operation: str, from_state: State | None, to_state: State) -> None:
        """A state change in the open write transaction, told to `observer` once it commits (`_settled`)."""
        if self.observer is not None:
            if self._told is None:
                self._told = []
            self._told.append((api, operation, from_state, to_state))

    def _settled(self, committed: bool) -> None:
        """The write transaction ended (base.py: `_write` calls this): tell `observer` what it committed."""
        told, self._told = self._told, None
        if not committed or not told or self.observer is None:
            return
        for change in told:
            try:
                self.observer(*change)
            except Exception:  # committed already: an observer's failure must not look like a failed write
                logger.exception("receipts store: the state change observer failed")

    def _event(
        self,
        operation_id: str,
        event: str,
        from_state: State | None,
        to_state: State,
        reason: str,
        actor: str,
        flow_id: str | None,
        at: str,
    ) -> None:
        self._execute(_EVENT_INSERT, (operation_id, at, event, from_state, to_state, reason, actor, flow_id))

    # --- the hot path ----------------------------------------------------------------------

    def begin_attempt(
        self,
        attempt: Attempt,
        *,
        after_success: str = "replay",
        replay_window: float = 86400.0,
        actor: str = "proxy",
        record_duplicate: bool | Callable[[Decision], bool] = True,
    ) -> Decision:
        """
        Decide what to do with an attempt and commit that decision before returning.

        - an unresolved receipt with the same fingerprint: "blocked" (and the blocked attempt is recorded);
        - a succeeded one: per `after_success`, "replay" (within `replay_window` seconds and
          with a recorded response), "blocked_succeeded", or a new attempt;
        - otherwise a new `submitted` receipt, with `retry_of` naming the previous one: "forward".

        A duplicate's answer is appended to the receipt's events, unless `record_duplicate` is
        False or says False of the decision (the proxy does not record a duplicate that will
        first wait for or reconcile the receipt; it records the answer it finally gets).
        """
        if after_success not in ("replay", "block", "allow"):
            raise ValueError(f"after_success must be replay, block or allow, not {after_success!r}")
        # A duplicate's answer need not be durable (base.py, "Durability"); a new receipt must. A
        # backend that can relax a transaction once it knows starts durable; SQLite cannot (its
        # pragma is set before BEGIN), so a guess from one indexed read decides, and a guess of
        # "duplicate" that turns out a new receipt is rolled back and decided again, durably.
        durable = self.relaxes_late or not self._likely_duplicate(attempt.intent_fingerprint, after_success)
        tries = 0
        while tries < 3:
            try:
                with self._write(durable=durable):
                    decision = self._decide(attempt, after_success, replay_window, actor, durable=durable)
                    record = record_duplicate(decision) if callable(record_duplicate) else record_duplicate
                    if decision.kind != "forward" and record:
                        r = decision.receipt
                        self._relax()
                        self._event(
                            r.operation_id,
                            "replayed" if decision.kind == "replay" else "blocked",
                            r.state,
                            r.state,
                            decision.reason,
                            actor,
                            attempt.flow_id,
                            iso(self.clock()),
                        )
                    return decision
            except _NeedsDurable:
                durable = True  # guessed a duplicate, and it is a new receipt: decide again, durably
            except UniqueViolation:
                tries += 1  # lost a race on the unique index to another connection: decide again
        raise StoreUnavailable(f"could not record the attempt in {self.location}: the unique index kept refusing it")

    def _likely_duplicate(self, fingerprint: str, after_success: str) -> bool:
        """
        Outside any transaction, a guess: whether the latest receipt of this intent makes the
        next attempt a duplicate (unresolved, or succeeded and not `allow`). Only the
        durability of the transaction that decides depends on it, never the decision.
        """
        rows = self._rows(
            f"SELECT state FROM receipts WHERE intent_fingerprint = ? ORDER BY {self.dialect.insertion_order} DESC "
            "LIMIT 1",
            (fingerprint,),
        )
        if not rows:
            return False
        state = rows[0]["state"]
        return state in UNRESOLVED or (state == State.SUCCEEDED and after_success != "allow")

    def _decide(
        self, a: Attempt, after_success: str, replay_window: float, actor: str, *, durable: bool = True
    ) -> Decision:
        """In the write transaction: answer a duplicate from its receipt, or insert a new one (if `durable`)."""
        now = self.clock()
        order = self.dialect.insertion_order
        latest = self._receipt(
            f"SELECT * FROM receipts WHERE intent_fingerprint = ? ORDER BY {order} DESC LIMIT 1",
            (a.intent_fingerprint,),
        )
        if a.client_key:
            other = self._receipt(
                "SELECT * FROM receipts WHERE client_key = ? AND intent_fingerprint != ? "
                f"ORDER BY {order} DESC LIMIT 1",
                (a.client_key, a.intent_fingerprint),
            )
            if other is not None:  # draft-ietf-httpapi-idempotency-key-header: a reused key, another request
                return Decision(
                    "key_conflict", other, "duplicate blocked: its Idempotency-Key was used for a different request"
                )
        # An unresolved receipt is always its intent's latest: a receipt is inserted only when none
        # is unresolved, and a resolved one never becomes unresolved again (states.TERMINAL). A
        # database that says otherwise cannot get a second one in: the partial unique index refuses
        # the insert, and the attempt ends StoreUnavailable (nothing forwarded).
        unresolved = latest if latest is not None and latest.state in UNRESOLVED else None
        if unresolved is not None:
            return Decision("blocked", unresolved, "duplicate blocked: the first attempt is unresolved")
        if latest is not None and latest.state is State.SUCCEEDED and after_success != "allow":
            answer = self._after_success(latest, after_success, replay_window, now)
            if answer is not None:
                return answer
        if latest is not None and latest.state not in RETRYABLE and latest.state is not State.SUCCEEDED:
            raise StoreError(f"receipt {latest.operation_id} is in state {latest.state} with no unresolved index entry")
        if not durable:
            raise _NeedsDurable
        return self._insert(a, latest, now, actor)

    def _after_success(
        self, latest: Receipt, after_success: str, replay_window: float, now: dt.datetime
    ) -> Decision | None:
        """A duplicate of a success: replayed, blocked, or (older than the window) None: a new attempt."""
        if after_success == "block":
            return Decision("blocked_succeeded", latest, "duplicate blocked: the operation already succeeded")
        # updated_at: when it became succeeded (a terminal state, never updated again)
        age = (now - dt.datetime.fromisoformat(latest.updated_at)).total_seconds()
        if age > replay_window:
            return None
        if not self._answered_success(latest.operation_id):
            # Found by a read or resolved by hand: the recorded answer (a 5xx, an "already
            # exists") is not the success, so it is never replayed as one.
            return Decision(
                "blocked_succeeded",
                latest,
                "duplicate blocked: succeeded (settled after the answer, which is not replayed)",
            )
        if latest.response is not None and not latest.response.truncated:
            return Decision("replay", latest, "duplicate answered with the recorded response")
        return Decision(
            "blocked_succeeded", latest, "duplicate blocked: succeeded, and no complete response was recorded to replay"
        )

    def _answered_success(self, operation_id: str) -> bool:
        """Whether a succeeded receipt became so from the upstream's answer (submitted → succeeded)."""
        rows = self._rows(
            "SELECT from_state FROM receipt_events WHERE operation_id = ? AND event = 'transition' AND to_state = ? "
            "ORDER BY id DESC LIMIT 1",
            (operation_id, State.SUCCEEDED),
        )
        return bool(rows) and rows[0]["from_state"] == State.SUBMITTED

    def _insert(self, a: Attempt, latest: Receipt | None, now: dt.datetime, actor: str) -> Decision:
        """A new receipt (and its first event) for an attempt to forward."""
        at = iso(now)
        retry_of = latest.operation_id if latest is not None else None
        operation_id = new_operation_id(now)
        first_state = State.AWAITING_APPROVAL if a.approval else State.SUBMITTED
        idempotency_key = idempotency_key_at = None
        if a.idempotency:
            # A retry of an attempt that provably did not happen reuses its key, so the server can
            # still deduplicate; after a success (after_success: allow) or a rejection, a new key.
            reuse = latest if latest is not None and latest.state in (State.NOT_SENT, State.SAFE_TO_RETRY) else None
            fresh = str(uuid.uuid4()) if a.key_format == "uuid4" else f"receipt-{operation_id}"
            idempotency_key = a.given_key or (reuse.idempotency_key if reuse is not None else None) or fresh
            if latest is not None and idempotency_key == latest.idempotency_key:  # the same key: it keeps its time
                idempotency_key_at = latest.idempotency_key_at or latest.submitted_at
            else:
                idempotency_key_at = at
        values = (
            operation_id,
            a.api,
            a.operation,
            a.method,
            a.target,
            first_state,
            a.intent_fingerprint,
            json.dumps(a.intent, sort_keys=True),
            a.principal,
            at,
            at,
            a.flow_id,
            retry_of,
            a.instance,
            idempotency_key,
            a.client_key,
            idempotency_key_at,
            a.raw_target,
        )
        self._execute(f"INSERT INTO receipts ({', '.join(_RECEIPT_COLUMNS)}) VALUES ({marks(len(values))})", values)
        reason = f"new attempt, retry of {retry_of}" if retry_of else "new attempt"
        self._event(operation_id, "transition", None, first_state, reason, actor, a.flow_id, at)
        self._changed(a.api, a.operation, None, first_state)
        # The receipt as inserted (the columns not inserted are NULL, failed_reads 0), not read back.
        row = dict.fromkeys(("completed_at", "http_status", "error", "external_id", "next_read_at"))
        return Decision("forward", Receipt.from_row({**row, **dict(zip(_RECEIPT_COLUMNS, values, strict=True))}))

    # --- transitions -----------------------------------------------------------------------

    def transition(
        self,
        operation_id: str,
        to: State,
        *,
        reason: str,
        actor: str = "proxy",
        expect: Sequence[State] | None = None,
        flow_id: str | None = None,
        **fields: Any,
    ) -> Receipt:
        """
        Move a receipt to `to`, from any state the transition table allows (or only from
        `expect`). Raises IllegalTransition if the table forbids it or the receipt has moved on.
        Fields: completed_at, http_status, error, external_id, response (a RecordedResponse),
        failed_reads and next_read_at (what reconcile records of its reads).
        """
        return self._transition(operation_id, to, reason, actor, expect, flow_id, fields, durable=True)

    def record_outcome(
        self, operation_id: str, to: State, *, reason: str, flow_id: str | None = None, **fields: Any
    ) -> Receipt:
        """
        A forwarded write's outcome: `submitted` → `to`, as `transition(..., expect=[SUBMITTED])`,
        committed without waiting for the disk. An OS crash may lose it, and then the receipt
        is `submitted` again, which recovery makes `outcome_unknown` (base.py, "Durability").
        """
        return self._transition(operation_id, to, reason, "proxy", [State.SUBMITTED], flow_id, fields, durable=False)

    def _transition(
        self,
        operation_id: str,
        to: State,
        reason: str,
        actor: str,
        expect: Sequence[State] | None,
        flow_id: str | None,
        fields: dict[str, Any],
        *,
        durable: bool,
    ) -> Receipt:
        unknown = set(fields) - _UPDATABLE
        if unknown:
            raise TypeError(f"transition() cannot set {', '.join(sorted(unknown))}")
        sources = sources_of(to)
        if expect is not None:
            bad = [s for s in expect if to not in TRANSITIONS[s]]
            if bad:
                raise IllegalTransition(f"{', '.join(bad)} → {to} is not a legal transition")
            sources = frozenset(expect)
        if not sources:
            raise IllegalTransition(f"nothing may move to {to}")
        sets: dict[str, Any] = {}
        for k, v in fields.items():
            if k != "response":
                sets[k] = v
            elif v is not None:
                sets.update(v.columns())
        with self._write(durable=durable):
            return self._step(
                operation_id, to, sources, sets, reason, actor, flow_id, set_completed="completed_at" not in fields
            )

    def _step(
        self,
        operation_id: str,
        to: State,
        sources: frozenset[State],
        sets: dict[str, Any],
        reason: str,
        actor: str,
        flow_id: str | None,
        *,
        set_completed: bool = True,
    ) -> Receipt:
        """One guarded state change inside an open write transaction. Returns the receipt as it now is."""
        at = iso(self.clock())
        sets = {**sets, "state": str(to), "updated_at": at}
        rows = self._rows("SELECT * FROM receipts WHERE operation_id = ?", (operation_id,))
        if not rows:
            raise UnknownReceipt(f"no receipt {operation_id}")
        row = Receipt.from_row(rows[0])
        if row.state is State.SUBMITTED and set_completed:
            sets["completed_at"] = at  # the attempt is over, whatever we learned of it
        changed = self._execute(
            f"UPDATE receipts SET {', '.join(f'{k} = ?' for k in sets)} "
            f"WHERE operation_id = ? AND state IN ({marks(len(sources))})",
            (*sets.values(), operation_id, *sorted(sources)),
        )
        if changed != 1:
            raise IllegalTransition(f"receipt {operation_id} is {row.state}; {row.state} → {to} is not allowed")
        self._event(operation_id, "transition", row.state, to, reason, actor, flow_id, at)
        self._changed(row.api, row.operation, row.state, to)
        return Receipt.from_row({**rows[0], **sets})  # what the UPDATE wrote, not read back

    # --- human decisions and reconciliation ------------------------------------------------

    def resolve(
        self, operation_id: str, to: State, *, note: str, actor: str, external_id: str | None = None
    ) -> Receipt:
        """
        A human decision: `outcome_unknown` or `manual_review` → succeeded, safe_to_retry or
        rejected. An `outcome_unknown` receipt passes through `manual_review` (two events, one
        transaction). Anything else raises IllegalTransition.
        """
        if to not in RESOLUTIONS:
            raise IllegalTransition(f"a receipt can be resolved as {', '.join(RESOLUTIONS)}, not {to}")
        if not note.strip():
            raise ValueError("a resolution needs a note saying why")
        fields: dict[str, Any] = {"external_id": external_id} if external_id else {}
        with self._write():
            current = self.get(operation_id).state
            if current is State.OUTCOME_UNKNOWN:
                self._step(
                    operation_id,
                    State.MANUAL_REVIEW,
                    frozenset({current}),
                    {},
                    f"taken into review: {note}",
                    actor,
                    None,
                )
                current = State.MANUAL_REVIEW
            if current is not State.MANUAL_REVIEW:
                raise IllegalTransition(
                    f"receipt {operation_id} is {current}; "
                    "only outcome_unknown and manual_review receipts are resolved by hand"
                )
            self._step(
                operation_id, to, frozenset({State.MANUAL_REVIEW}), fields, f"resolved by hand: {note}", actor, None
            )
        return self.get(operation_id)

    def decide_approval(
        self,
        operation_id: str,
        *,
        approve: bool,
        note: str,
        actor: str,
        fingerprint: str | None = None,
        is_alive: Callable[[str | None], bool] = lambda instance: True,
    ) -> ApprovalDecision:
        """
        Record an operator's decision on a write held for approval (`receipts approve` / `deny`),
        for the proxy that holds it to apply (`apply_approval`). Refused with IllegalTransition,
        nothing written, unless the receipt is `awaiting_approval`, has no decision yet, is held
        by a proxy that is running (`is_alive(receipt.instance)`) and, when `fingerprint` is
        given, has an intent fingerprint that starts with it. An unknown id: UnknownReceipt.
        """
        if not approve and not note.strip():
            raise ValueError("a denial needs a note saying why")
        with self._write():
            r = self.get(operation_id)
            if r.state is not State.AWAITING_APPROVAL:
                raise IllegalTransition(
                    f"receipt {operation_id} is {r.state}, not awaiting_approval: only a write held for approval "
                    "can be approved or denied"
                )
            earlier = self.approval_decision(operation_id)
            if earlier is not None:
                raise IllegalTransition(
                    f"receipt {operation_id} was already {earlier.decision} by {earlier.actor} "
                    f"at {earlier.decided_at}: a held write is decided once"
                )
            if fingerprint is not None and not r.intent_fingerprint.startswith(fingerprint):
                raise IllegalTransition(
                    f"receipt {operation_id} has the intent fingerprint {r.intent_fingerprint}, not {fingerprint}...: "
                    "it is not the write you meant"
                )
            if not is_alive(r.instance):
                raise IllegalTransition(
                    f"receipt {operation_id} is not held: the proxy that held it (instance {r.instance}) has stopped; "
                    "nothing was sent, and the next proxy start records it not_sent"
                )
            self._execute(
                "INSERT INTO approval_decisions "
                "(operation_id, intent_fingerprint, decision, note, actor, decided_at) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    operation_id,
                    r.intent_fingerprint,
                    "approved" if approve else "denied",
                    note.strip(),
                    actor,
                    iso(self.clock()),
                ),
            )
        decision = self.approval_decision(operation_id)
        assert decision is not None
        return decision

    def apply_approval(
        self, decision: ApprovalDecision, *, fingerprint: str, reason: str, flow_id: str | None = None
    ) -> Receipt:
        """
        Apply an operator's decision to the write this proxy holds, in one transaction: the
        decision is marked used, and the receipt moves `awaiting_approval` → `submitted`
        (approved) or `rejected` (denied; `error` is `reason`), the event naming the decider.
        `fingerprint` is the held write's. A decision used already or changed, one for another
        intent, or a receipt no longer awaiting approval: IllegalTransition, nothing written.
        """
        operation_id = decision.operation_id
        to, fields = (State.SUBMITTED, {}) if decision.approved else (State.REJECTED, {"error": reason})
        with self._write():
            r = self.get(operation_id)
            if not fingerprint == r.intent_fingerprint == decision.intent_fingerprint:
                raise IllegalTransition(
                    f"the decision on receipt {operation_id} is for the intent {decision.intent_fingerprint}; "
                    f"the receipt's is {r.intent_fingerprint} and the held write's {fingerprint}: not applied"
                )
            used = self._execute(
                "UPDATE approval_decisions SET consumed_at = ? WHERE operation_id = ? AND intent_fingerprint = ? "
                "AND decision = ? AND consumed_at IS NULL",
                (iso(self.clock()), operation_id, fingerprint, decision.decision),
            )
            if used != 1:
                raise IllegalTransition(f"the decision on receipt {operation_id} was used already, or changed")
            self._step(operation_id, to, frozenset({State.AWAITING_APPROVAL}), fields, reason, decision.actor, flow_id)
        return self.get(operation_id)

    def claim_for_reconcile(self, operation_id: str, *, actor: str, reason: str = "reconciling with a read") -> Receipt:
        """
        `outcome_unknown`/`manual_review` → `reconciling`. Only one claimant wins;
        the others get IllegalTransition.
        """
        with self._write():
            self._step(
                operation_id,
                State.RECONCILING,
                frozenset({State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW}),
                {},
                reason,
                actor,
                None,
            )
        return self.get(operation_id)

    # --- retention -------------------------------------------------------------------------

    def prune(self, older_than: dt.timedelta, *, dry_run: bool = False) -> list[str]:
        """
        Delete resolved receipts (succeeded, rejected, not_sent, safe_to_retry) last changed
        more than `older_than` ago, with their events. Never an unresolved one, and never one
        that a kept receipt's `retry_of` still points at. Returns the deleted ids. An operator's
        decision on a pruned receipt goes with it.
        """
        cutoff = iso(self.clock() - older_than)
        resolved = sorted(TERMINAL)
        with self._write():
            candidates = {
                r["operation_id"]
                for r in self._rows(
                    f"SELECT operation_id FROM receipts WHERE updated_at < ? AND state IN ({marks(len(resolved))})",
                    (cutoff, *resolved),
                )
            }
            links = [
                (r["operation_id"], r["retry_of"])
                for r in self._rows("SELECT operation_id, retry_of FROM receipts WHERE retry_of IS NOT NULL")
            ]
            changed = True
            while changed:  # keep whatever a kept receipt points at
                changed = False
                for operation_id, retry_of in links:
                    if operation_id not in candidates and retry_of in candidates:
                        candidates.discard(retry_of)
                        changed = True
            ids = sorted(candidates)
            if ids and not dry_run:
                self._defer_foreign_keys()  # a receipt goes before its events, and chains go in any order
                for chunk in (ids[i : i + _CHUNK] for i in range(0, len(ids), _CHUNK)):
                    self._execute(f"DELETE FROM approval_decisions WHERE operation_id IN ({marks(len(chunk))})", chunk)
                    self._execute(f"DELETE FROM receipts WHERE operation_id IN ({marks(len(chunk))})", chunk)
                    self._execute(f"DELETE FROM receipt_events WHERE operation_id IN ({marks(len(chunk))})", chunk)
        return ids

    # --- recovery --------------------------------------------------------------------------

    def recover_in_flight(
        self,
        *,
        is_alive: Callable[[str | None], bool],
        actor: str = "proxy",
        stopped: Callable[[str | None], str] | None = None,
    ) -> list[str]:
        """
        Receipts left `submitted` (or `reconciling`) by a proxy instance that is no longer
        running become `outcome_unknown`: the request may have left; `awaiting_approval` ones
        become `not_sent`: they never left. Returns their ids. `stopped(instance)` words how the
        instance was found stopped (default "proxy stopped"), so that the event names it.
        """
        rows = self._rows(
            "SELECT operation_id, state, instance FROM receipts WHERE state IN (?, ?, ?)",
            (State.SUBMITTED, State.RECONCILING, State.AWAITING_APPROVAL),
        )
        recovered = []
        outcomes = {
            State.SUBMITTED: (State.OUTCOME_UNKNOWN, "proxy stopped while the request was in flight"),
            State.RECONCILING: (State.OUTCOME_UNKNOWN, "proxy stopped while reconciling"),
            State.AWAITING_APPROVAL: (State.NOT_SENT, "proxy stopped while the request awaited approval"),
        }
        for row in rows:
            if is_alive(row["instance"]):
                continue
            state = State(row["state"])
            to, reason = outcomes[state]
            if stopped is not None:
                reason = reason.replace("proxy stopped", stopped(row["instance"]), 1)
            try:
                self.transition(row["operation_id"], to, reason=reason, actor=actor, expect=[state], error=reason)
            except IllegalTransition:
                continue  # another process moved it on meanwhile
            recovered.append(row["operation_id"])
        return recovered
