"""
The hot path: deciding an attempt (`begin_attempt`), in one write transaction committed before
it returns: a duplicate answered from its receipt (blocked, or a success replayed), or a new
receipt inserted, with its first event, for the proxy to forward.

`answer_duplicate` is the same decision for a connection that must never wait (the event
loop's, on SQLite in WAL mode): a duplicate is answered from one read, and its answer recorded
in the same transaction (not waiting for the disk); anything else ("new", or "busy": another
writer holds the lock or committed meanwhile) is left to `begin_attempt` on the store's thread.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from typing import Literal

from proxy_addon.errors import StoreError, StoreUnavailable
from proxy_addon.states import RETRYABLE, UNRESOLVED, State
from proxy_addon.store.base import UniqueViolation, WouldWait, marks
from proxy_addon.store.budgets import Overrun
from proxy_addon.store.decision_reasons import DENIED_BY_POLICY, OVER_BUDGET
from proxy_addon.store.records import DUPLICATE_SENT, Attempt, Decision, Receipt, iso, new_operation_id
from proxy_addon.store.rounds import ReceiptInterim

# The decisions that insert a new receipt (`_insert`): the others answer a duplicate from an existing one.
NEW_RECEIPT = ("forward", "denied", "over_budget")

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
    "fingerprint_scheme",
    "fingerprint_rule",
    "read_principal",
    "upstream_timeout",
    "in_flight_until",
    "error",
    "shadow_of",
    "trace_parent",
)


# How a succeeded receipt became so: the from_state of its transition to succeeded, in a
# subquery of the read that decides (`receipts` is that read's row). There is one (nothing
# leaves succeeded: states.TRANSITIONS), so it is looked for from the receipt's first event:
# from its last, each replay would scan every replay before it.
_ANSWERED_FROM = (
    "SELECT e.from_state FROM receipt_events e WHERE e.operation_id = receipts.operation_id "
    "AND e.event = 'transition' AND e.to_state = ? ORDER BY e.id LIMIT 1"
)


def _of_intent(a: Attempt) -> tuple[str, list[str]]:
    """
    The WHERE clause (and its parameters) of this attempt's intent's receipts: today's
    fingerprint and its earlier ones; a receipt under an edited rule's fingerprint only while
    unresolved (intent/earlier_fingerprints.py). Just today's when there are none (every write, once
    the receipts of earlier schemes and rules are resolved): one indexed lookup, as ever.
    """
    if not a.earlier and not a.earlier_unresolved:
        return "intent_fingerprint = ?", [a.intent_fingerprint]
    anyhow = (a.intent_fingerprint, *a.earlier)
    where = f"intent_fingerprint IN ({marks(len(anyhow))})"
    params = list(anyhow)
    if a.earlier_unresolved:
        states = sorted(UNRESOLVED)
        where += f" OR (intent_fingerprint IN ({marks(len(a.earlier_unresolved))}) AND state IN ({marks(len(states))}))"
        params += [*a.earlier_unresolved, *states]
    return f"({where})", params


def _unresolved_first(a: Attempt) -> str:
    """
    ORDER BY's first term: an intent's unresolved receipt comes first, whatever was inserted after
    it, so that it is never passed over: under an earlier fingerprint, by a proxy that did not yet
    know it; or beside a receipt observe mode sent later (`shadow_of`), which may be resolved first.
    The intent's receipts are few (one lookup on its fingerprint's index, then a sort of them).
    """
    return f"CASE WHEN state IN ({', '.join(repr(str(s)) for s in sorted(UNRESOLVED))}) THEN 0 ELSE 1 END, "


def continues(a: Attempt, latest: Receipt) -> bool:
    """
    Whether attempt `a` is sent under the key of its intent's latest receipt (`latest`), which
    then wins over any key the agent sent: the latest provably did not happen or its API
    deduplicates a resend by that key (not_sent, safe_to_retry), or the agent sent `a` with the
    same Idempotency-Key as `latest` (the same client_key): it asks for that very request again.
    Otherwise (a rejection, a success with after_success: allow) the key is renewed: the
    agent's own body id, or a fresh key. An idempotency key is renewed only after a proven
    refusal or a proven absence.
    """
    if latest.state in (State.NOT_SENT, State.SAFE_TO_RETRY):
        return True
    return a.client_key is not None and a.client_key == latest.client_key


class _NeedsDurable(Exception):
    """A transaction begun as not durable was about to insert a receipt: rolled back, begun again durably."""


class _NeedsLock(Exception):
    """The decision answers on a receipt of an intent it has not locked: rolled back, decided again with its lock."""

    def __init__(self, fingerprint: str):
        super().__init__(fingerprint)
        self.fingerprint = fingerprint


def _intents(a: Attempt, extra: tuple[str, ...]) -> tuple[str, ...]:
    """
    The intents an attempt's decision locks (postgres.py, "One winner per intent"): every
    fingerprint it may be recorded under, its Idempotency-Key (two requests that share it are
    told apart: a `key_conflict`), its budgets (`Charge.lock`: two proxies never both take a
    budget's last unit), and `extra`, an intent it answers on (that key's receipt).
    """
    budgets = tuple(c.lock for c in a.charges)  # its budgets: one decision at a time on each (store/budgets.py)
    return (*a.fingerprints, *((f"key:{a.client_key}",) if a.client_key else ()), *budgets, *extra)


class ReceiptAttempts(ReceiptInterim):
    """Deciding an attempt: answer a duplicate, or insert a new receipt to forward."""

    def begin_attempt(
        self,
        attempt: Attempt,
        *,
        after_success: str = "replay",
        replay_window: float = 86400.0,
        actor: str = "proxy",
        record_duplicate: bool | Callable[[Decision], bool] = True,
        durable: bool | None = None,
    ) -> Decision:
        """
        Decide what to do with an attempt and commit that decision before returning.

        - an unresolved receipt with the same fingerprint: "blocked" (and the blocked attempt is recorded);
        - a succeeded one: per `after_success`, "replay" (within `replay_window` seconds and
          with a recorded response), "blocked_succeeded", or a new attempt;
        - otherwise a new `submitted` receipt, with `retry_of` naming the previous one: "forward"
          (`awaiting_approval` when held; `rejected`, "denied", when a `deny` decision refused it).

        A duplicate's answer is appended to the receipt's events, unless `record_duplicate` is
        False or says False of the decision (the proxy does not record a duplicate that will
        first wait for or reconcile the receipt; it records the answer it finally gets).
        `durable=True`: begin durably without the guess below (`answer_duplicate` just read it
        is a new receipt); the decision is the transaction's, whatever was read before.
        """
        if after_success not in ("replay", "block", "allow"):
            raise ValueError(f"after_success must be replay, block or allow, not {after_success!r}")
        # A duplicate's answer need not be durable (base.py, "Durability"); a new receipt must. A
        # backend that can relax a transaction once it knows starts durable; SQLite cannot (its
        # pragma is set before BEGIN), so a guess from one indexed read decides, and a guess of
        # "duplicate" that turns out a new receipt is rolled back and decided again, durably.
        if not durable:  # observe mode sends a duplicate too, as a new receipt: durable
            durable = self.relaxes_late or attempt.observe or not self._likely_duplicate(attempt, after_success)
        tries = 0
        extra: tuple[str, ...] = ()
        while tries < 3:
            intents = _intents(attempt, extra)
            try:
                with self._write(durable=durable, intents=intents):
                    decision = self._decide(
                        attempt, after_success, replay_window, actor, durable=durable, locked=intents
                    )
                    if decision.kind not in NEW_RECEIPT:  # a duplicate's answer, in its receipt's events
                        self._record_duplicate(decision, attempt, actor, record_duplicate)
                    return decision
            except _NeedsDurable:
                durable = True  # guessed a duplicate, and it is a new receipt: decide again, durably
            except _NeedsLock as more:
                tries += 1  # its answer is on another intent's receipt: decide again holding that intent's lock too
                extra = (*extra, more.fingerprint)
            except UniqueViolation:
                tries += 1  # lost a race on the unique index to another connection: decide again
        raise StoreUnavailable(f"could not record the attempt in {self.location}: the unique index kept refusing it")

    def answer_duplicate(
        self,
        attempt: Attempt,
        *,
        after_success: str = "replay",
        replay_window: float = 86400.0,
        actor: str = "proxy",
        record_duplicate: bool | Callable[[Decision], bool] = True,
        look_first: bool = True,
    ) -> Decision | Literal["new", "busy"]:
        """
        `begin_attempt`'s decision, without ever waiting (where `snapshot_writes`: SQLite in
        WAL mode, on a connection opened with lock_timeout=0, such as the event loop's). A
        duplicate is answered from one read of the committed receipts, and its answer (as
        `begin_attempt` records it) written in the same transaction, which becomes a write
        only if no other writer committed since that read, and commits without waiting for
        the disk. "new": the read found no duplicate (a new receipt is due: `begin_attempt`,
        `durable=True`); "busy": another writer holds the lock or wrote meanwhile (nothing
        written: `begin_attempt` decides). `look_first`: an indexed read outside any transaction
        first, so that an intent with no duplicate opens none (False for a likely retry).
        """
        if not self.snapshot_writes:
            return "busy"
        if attempt.observe:  # observe mode: even a duplicate is a new receipt, sent (`_observed`)
            return "new"
        if look_first and not self._likely_duplicate(attempt, after_success):
            # One indexed read, outside any transaction, says a new receipt is due: no transaction
            # begun for nothing. If a duplicate commits right after it, `begin_attempt` decides so.
            return "new"
        try:
            with self._snapshot_write():
                try:
                    decision = self._decide(attempt, after_success, replay_window, actor, durable=False)
                except _NeedsDurable:
                    return "new"  # nothing was written: the transaction only read
                self._record_duplicate(decision, attempt, actor, record_duplicate)
                return decision
        except WouldWait:
            return "busy"

    def _record_duplicate(
        self, decision: Decision, attempt: Attempt, actor: str, record: bool | Callable[[Decision], bool]
    ) -> None:
        """In the deciding transaction: a duplicate's answer in its receipt's events (not durable), if `record`."""
        if not (record(decision) if callable(record) else record):
            return
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

    def _likely_duplicate(self, a: Attempt, after_success: str) -> bool:
        """
        Outside any transaction, a guess: whether the latest receipt of this intent makes the
        next attempt a duplicate (unresolved, or succeeded and not `allow`). Only the
        durability of the transaction that decides depends on it, never the decision.
        """
        where, params = _of_intent(a)
        rows = self._rows(
            f"SELECT state FROM receipts WHERE {where} ORDER BY {_unresolved_first(a)}{self.dialect.insertion_order} "
            "DESC LIMIT 1",
            params,
        )
        if not rows:
            return False
        state = rows[0]["state"]
        return state in UNRESOLVED or (state == State.SUCCEEDED and after_success != "allow")

    def _decide(
        self,
        a: Attempt,
        after_success: str,
        replay_window: float,
        actor: str,
        *,
        durable: bool = True,
        locked: tuple[str, ...] = (),
    ) -> Decision:
        """
        In the write transaction: answer a duplicate from its receipt, or insert a new one (if
        `durable`). `locked`: the intents the transaction holds, where the store `locks_per_intent`.
        """
        now = self.clock()
        order = self.dialect.insertion_order
        # One read: the latest receipt of this intent (under any of its fingerprints: an earlier
        # scheme's or rule's, intent/earlier_fingerprints.py) and, if it succeeded, how (_after_success).
        where, params = _of_intent(a)
        rows = self._rows(  # the subquery of how it succeeded runs for the one row chosen, never per row sorted
            f"SELECT *, CASE WHEN state = ? THEN ({_ANSWERED_FROM}) END AS answered_from FROM "
            f"(SELECT * FROM receipts WHERE {where} ORDER BY {_unresolved_first(a)}{order} DESC LIMIT 1) receipts",
            (State.SUCCEEDED, State.SUCCEEDED, *params),
        )
        latest = Receipt.from_row(rows[0]) if rows else None
        if a.client_key:
            mine = a.fingerprints
            other = self._receipt(
                f"SELECT * FROM receipts WHERE client_key = ? AND intent_fingerprint NOT IN ({marks(len(mine))}) "
                f"ORDER BY {order} DESC LIMIT 1",
                (a.client_key, *mine),
            )
            if other is not None:  # draft-ietf-httpapi-idempotency-key-header: a reused key, another request
                if self.locks_per_intent and other.intent_fingerprint not in locked:
                    raise _NeedsLock(other.intent_fingerprint)  # its blocked event goes under its intent's lock
                why = "duplicate blocked: its Idempotency-Key was used for a different request"
                return self._observed(a, Decision("key_conflict", other, why), latest, now, actor, durable=durable)
        # An intent's unresolved receipt is read first (`_unresolved_first`): a receipt is inserted only
        # when none is unresolved, but for one observe mode sends beside it (`shadow_of`), which the
        # partial unique index leaves out. A second non-shadow one cannot get in: the index refuses the
        # insert, and the attempt ends StoreUnavailable (nothing forwarded).
        unresolved = latest if latest is not None and latest.state in UNRESOLVED else None
        if unresolved is not None:
            d = self._unresolved(a, unresolved, rows[0].get("task_sealed"), now, actor, durable=durable)
            return self._observed(a, d, latest, now, actor, durable=durable)
        if latest is not None and latest.state is State.SUCCEEDED and after_success != "allow":
            answered = rows[0]["answered_from"] == State.SUBMITTED
            replayable = latest.intent_fingerprint not in a.unreplayable
            answer = self._after_success(
                latest, after_success, replay_window, now, answered=answered, replayable=replayable
            )
            if answer is not None:
                return self._observed(a, answer, latest, now, actor, durable=durable)
        if latest is not None and latest.state not in RETRYABLE and latest.state is not State.SUCCEEDED:
            raise StoreError(f"receipt {latest.operation_id} is in state {latest.state} with no unresolved index entry")
        if not durable:
            raise _NeedsDurable
        return self._insert(a, latest, now, actor)

    def _observed(
        self, a: Attempt, d: Decision, latest: Receipt | None, now: dt.datetime, actor: str, *, durable: bool
    ) -> Decision:
        """
        Enforcement's answer `d` to a duplicate, or in observe mode (Attempt.observe) a new receipt sent in
        its stead, whose events say what enforcement would have done (`_insert`). The next round of an MCP
        call waiting for input (`a.continues`) is no new write: it goes on under its call's receipt, or is
        refused, as in enforce mode.
        """
        if not a.observe or a.continues or d.kind == "forward":
            return d
        if not durable:
            raise _NeedsDurable  # a receipt is inserted: begun again durably
        return self._insert(a, latest, now, actor, would=d)

    def _unresolved(
        self, a: Attempt, r: Receipt, task_sealed: object, now: dt.datetime, actor: str, *, durable: bool
    ) -> Decision:
        """
        An attempt whose intent has an unresolved receipt: blocked, but for the next round of a call
        whose server asked for input, which goes on under that receipt (store/rounds.py).
        """
        if r.state is State.SUBMITTED and r.waiting_for == "input":
            if self._abandoned(r, now):
                r = self._input_abandoned(r, a, actor)
            elif a.continues:
                if r.mcp_rounds > a.mcp_rounds:
                    return self._rounds_exceeded(r, a, actor)
                if not durable:
                    raise _NeedsDurable  # it is sent next: its renewed lifetime must be on disk first
                return self._continue(r, a, now, actor)
            else:
                return Decision(
                    "blocked", r, "duplicate blocked: the first attempt waits for the input its server asked for"
                )
        if r.state is State.SUBMITTED and r.waiting_for == "task":
            task_id = self._task_id_for(r, a, task_sealed)
            return Decision("blocked", r, "duplicate blocked: the first attempt's task is not done", task_id=task_id)
        return Decision("blocked", r, "duplicate blocked: the first attempt is unresolved")

    def _after_success(
        self,
        latest: Receipt,
        after_success: str,
        replay_window: float,
        now: dt.datetime,
        *,
        answered: bool,
        replayable: bool = True,
    ) -> Decision | None:
        """
        A duplicate of a success: replayed, blocked, or (older than the window) None: a new attempt.
        `answered`: it became succeeded from the upstream's answer (submitted → succeeded).
        `replayable`: False when the receipt may be another caller's (Attempt.unreplayable): blocked.
        """
        if after_success == "block":
            return Decision("blocked_succeeded", latest, "duplicate blocked: the operation already succeeded")
        # updated_at: when it became succeeded (a terminal state, never updated again)
        age = (now - dt.datetime.fromisoformat(latest.updated_at)).total_seconds()
        if age > replay_window:
            return None
        if not answered:
            # Found by a read or resolved by hand: the recorded answer (a 5xx, an "already
            # exists") is not the success, so it is never replayed as one.
            return Decision(
                "blocked_succeeded",
                latest,
                "duplicate blocked: succeeded (settled after the answer, which is not replayed)",
            )
        if not replayable:
            return Decision(
                "blocked_succeeded",
                latest,
                "duplicate blocked: succeeded, and its answer is not replayed to a caller the proxy cannot tell "
                "from the one it answered",
            )
        if latest.response is None:  # its rule says `record: false`
            return Decision("blocked_succeeded", latest, "duplicate blocked: succeeded, no answer recorded")
        if latest.response.truncated:
            return Decision(
                "blocked_succeeded",
                latest,
                "duplicate blocked: succeeded, and no complete response was recorded to replay",
            )
        answer = latest.response.clear  # recorded in clear by an earlier version
        if answer is None:
            try:  # opened only here, to replay it (sealing.py)
                if self.answer_seal is None:
                    raise StoreError("this store has no key to open recorded answers with")
                answer = self.answer_seal.open(latest.operation_id, latest.response)
            except StoreError as e:
                why = f"duplicate blocked: succeeded, and its recorded answer cannot be read: {e}"
                return Decision("blocked_succeeded", latest, why)
        return Decision("replay", latest, "duplicate answered with the recorded response", answer=answer)

    def _insert(
        self, a: Attempt, latest: Receipt | None, now: dt.datetime, actor: str, would: Decision | None = None
    ) -> Decision:
        """
        A new receipt (and its first event) for an attempt to forward, charged to its budgets; or,
        denied by a decision or over a budget, recorded rejected and never sent (it takes no share).
        In observe mode (`would`: enforcement's answer to it as a duplicate) none of them holds it:
        each is an event (`_would_events`), and it is sent and charged.
        """
        self._hold_lease(a)
        at = iso(now)
        retry_of = latest.operation_id if latest is not None else None
        operation_id = new_operation_id(now)
        # Over budget: store/budgets.py's `over_budget`, in this transaction, under the budget's lock.
        overrun = self._budget_overrun(a, now) if a.denied is None or a.observe else None
        error = _refusal(a, overrun)  # None: it is sent
        first_state = State.REJECTED if error else _first_state(a)
        idempotency_key, idempotency_key_at = _key_of(a, latest, operation_id, at) if not error else (None, None)
        in_flight_until = _in_flight_until(a, first_state, now)
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
            a.fingerprint_scheme,
            a.fingerprint_rule,
            a.read_principal,
            a.upstream_timeout,
            in_flight_until,
            error,
            would.receipt.operation_id if would is not None else None,
            a.trace_parent,
        )
        self._execute(f"INSERT INTO receipts ({', '.join(_RECEIPT_COLUMNS)}) VALUES ({marks(len(values))})", values)
        reason = f"{error}; not sent" if error else _new_attempt(a, retry_of, first_state)
        self._event(operation_id, "transition", None, first_state, reason, actor, a.flow_id, at)
        if not error:
            self._charge(operation_id, a, now)
        self._changed(a.api, a.operation, None, first_state)
        kinds = self._would_events(a, would, overrun, operation_id, at, actor) if a.observe else ()
        # The receipt as inserted (the columns not inserted are NULL, failed_reads 0), not read back.
        row = dict.fromkeys(("completed_at", "http_status", "external_id", "next_read_at"))
        inserted = Receipt.from_row({**row, **dict(zip(_RECEIPT_COLUMNS, values, strict=True))})
        if error:
            return _refused(a, inserted, reason, overrun)
        return Decision("forward", inserted, would=kinds)

    def _would_events(
        self, a: Attempt, would: Decision | None, overrun: Overrun | None, operation_id: str, at: str, actor: str
    ) -> tuple[str, ...]:
        """
        Observe mode: what enforcement would have done to a receipt sent now, each an event of it (their
        kinds returned); and on the receipt a duplicate would have been answered from, that it was sent.
        """
        said: list[tuple[str, str]] = []
        if would is not None:
            earlier = would.receipt
            if would.kind == "replay":
                said.append(("would_replay", f"would have replayed receipt {earlier.operation_id}'s recorded answer"))
            else:
                why = would.reason.removeprefix("duplicate blocked: ")
                said.append(
                    (
                        "would_block",
                        f"would have blocked: duplicate of receipt {earlier.operation_id} ({earlier.state}): {why}",
                    )
                )
            self._event(
                earlier.operation_id,
                DUPLICATE_SENT,
                earlier.state,
                earlier.state,
                f"a duplicate was sent as receipt {operation_id} (receipts_mode=observe): {would.reason}",
                actor,
                a.flow_id,
                at,
            )
        if a.approval:
            said.append(("would_hold", f"would have held for approval ({a.approval_why or 'approve: true'})"))
        if a.denied is not None:
            said.append(("would_deny", f"would have denied by policy {a.denied}"))
        if overrun is not None:
            said.append(("would_refuse", f"would have refused: over budget: {overrun.why}"))
        for kind, reason in said:
            self._event(
                operation_id,
                kind,
                State.SUBMITTED,
                State.SUBMITTED,
                f"{reason}; sent (receipts_mode=observe)",
                actor,
                a.flow_id,
                at,
            )
        return tuple(kind for kind, _ in said)


def _first_state(a: Attempt) -> State:
    """
    A new receipt's: rejected for a `deny` decision (never sent; rejected never blocks a retry), held for
    an approval, else submitted. In observe mode always submitted: neither holds it (`_would_events`).
    """
    if a.observe:
        return State.SUBMITTED
    if a.denied is not None:
        return State.REJECTED
    return State.AWAITING_APPROVAL if a.approval else State.SUBMITTED


def _new_attempt(a: Attempt, retry_of: str | None, first_state: State) -> str:
    """A new receipt's first event: a new attempt (a retry of which), held by a rule's decision (which)."""
    said = f"new attempt, retry of {retry_of}" if retry_of else "new attempt"
    if first_state is State.AWAITING_APPROVAL and a.approval_why and a.approval_why != "approve: true":
        said += f", held for approval by {a.approval_why}"
    return said


def _in_flight_until(a: Attempt, first_state: State, now: dt.datetime) -> str | None:
    """Sent now (or once approved: transitions.py sets it then): held open at most its upstream timeout."""
    if a.upstream_timeout is None or first_state is not State.SUBMITTED:
        return None
    return iso(now + dt.timedelta(seconds=a.upstream_timeout))


def _refusal(a: Attempt, overrun: Overrun | None) -> str | None:
    """Why a new attempt is refused and not sent (its receipt's error): a `deny` decision, or a budget
    without room; None: it is sent (always in observe mode, where `_would_events` records them)."""
    if a.observe:
        return None
    if a.denied is not None:
        return f"{DENIED_BY_POLICY}{a.denied}"
    return f"{OVER_BUDGET}{overrun.why}" if overrun is not None else None


def _refused(a: Attempt, inserted: Receipt, reason: str, overrun: Overrun | None) -> Decision:
    """A refused new receipt's decision (recorded rejected): a decision denied it (403), or a budget (429)."""
    if a.denied is not None or overrun is None:
        return Decision("denied", inserted, reason)
    return Decision("over_budget", inserted, reason, retry_after=overrun.retry_after)


def _key_of(a: Attempt, latest: Receipt | None, operation_id: str, at: str) -> tuple[str | None, str | None]:
    """The Idempotency-Key a new attempt is sent with, and since when it is in use."""
    if not a.idempotency:
        return None, None
    fresh = str(uuid.uuid4()) if a.key_format == "uuid4" else f"receipt-{operation_id}"
    # Observe mode sends a duplicate of an unresolved receipt: under that receipt's key, never renewed
    # without a proven refusal or absence (an API that deduplicates by it then does).
    goes_on = latest is not None and (continues(a, latest) or (a.observe and latest.unresolved))
    remembered = latest.idempotency_key if latest is not None and goes_on else None
    # The remembered key wins over the agent's own (given_key, a body id): forward.add_key
    # puts it in the request in place of whatever the agent sent.
    key = remembered or a.given_key or fresh
    if latest is not None and key == latest.idempotency_key:  # the same key: it keeps its time
        return key, latest.idempotency_key_at or latest.submitted_at
    return key, at
