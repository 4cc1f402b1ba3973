"""
The receipts store: every SQL statement and every state change lives here.

    store = Store.open("receipts.db")
    decision = store.begin_attempt(attempt)      # committed before it returns
    if decision.kind == "forward":
        ...send once...
        store.transition(decision.receipt.operation_id, State.SUCCEEDED, reason="HTTP 201")

Guarantees (the ones a PostgreSQL backend must keep too):
- `begin_attempt` decides and writes in one `BEGIN IMMEDIATE` transaction, and a
  partial unique index on `intent_fingerprint` over the unresolved states makes
  two identical attempts, even from two processes, yield one forwarded request.
- `transition` checks `TRANSITIONS`, then runs `UPDATE ... WHERE state IN (...)` and
  checks the row count, and appends to `receipt_events` in the same transaction.
- `receipt_events` is append-only (triggers refuse UPDATE and DELETE).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from proxy_addon.errors import IllegalTransition, StoreError, StoreUnavailable, UnknownReceipt
from proxy_addon.states import RESOLUTIONS, RETRYABLE, TERMINAL, TRANSITIONS, UNRESOLVED, State, sources_of

Clock = Callable[[], dt.datetime]
DecisionKind = Literal["forward", "blocked", "replay", "blocked_succeeded", "key_conflict"]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_operation_id(now: dt.datetime) -> str:
    """Time-sortable: `20260816T012030Z-1fd54b31a2`."""
    return f"{now.astimezone(dt.UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(5)}"


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
    given_key: str | None = None  # the agent's own key in the body (idempotency_key.body): kept as the key
    approval: bool = False  # held for an operator's approval before it is sent


@dataclass(frozen=True)
class RecordedResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    truncated: bool = False


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
    response: RecordedResponse | None = field(default=None, repr=False)
    idempotency_key: str | None = None
    client_key: str | None = None
    idempotency_key_at: str | None = None  # when this key was first sent (by this receipt or one it retries)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Receipt:
        try:
            state = State(row["state"])
        except ValueError:
            raise StoreError(f"receipt {row['operation_id']} has unknown state {row['state']!r}") from None
        response = None
        if row.get("response_status") is not None:
            response = RecordedResponse(
                status=row["response_status"],
                headers=[tuple(h) for h in json.loads(row["response_headers"] or "[]")],
                body=row["response_body"] or b"",
                truncated=bool(row["response_truncated"]),
            )
        return cls(
            operation_id=row["operation_id"], api=row["api"], operation=row["operation"],
            method=row["method"], target=row["target"], state=state,
            intent_fingerprint=row["intent_fingerprint"], intent=json.loads(row["intent"]),
            principal=row["principal"], submitted_at=row["submitted_at"],
            updated_at=row["updated_at"], completed_at=row["completed_at"],
            http_status=row["http_status"], error=row["error"], external_id=row["external_id"],
            flow_id=row["flow_id"], retry_of=row["retry_of"], instance=row["instance"],
            response=response, idempotency_key=row.get("idempotency_key"), client_key=row.get("client_key"),
            idempotency_key_at=row.get("idempotency_key_at"),
        )

    @property
    def unresolved(self) -> bool:
        return self.state in UNRESOLVED


@dataclass(frozen=True)
class Event:
    id: int
    operation_id: str
    at: str
    event: str  # "transition", "blocked" or "replayed"
    from_state: State | None
    to_state: State
    reason: str
    actor: str
    flow_id: str | None


@dataclass(frozen=True)
class Decision:
    """What to do with an attempt: forward it (a new receipt) or answer from an existing one."""

    kind: DecisionKind
    receipt: Receipt
    reason: str = ""  # for a duplicate: why it gets this answer (recorded in the receipt's events)


migrations = Migrations("receipt-proxy")


@migrations()
def m001_receipts(db: Database) -> None:
    db.execute(
        """
        CREATE TABLE receipts (
            operation_id TEXT PRIMARY KEY,
            api TEXT NOT NULL,
            operation TEXT NOT NULL,
            method TEXT NOT NULL,
            target TEXT NOT NULL,
            state TEXT NOT NULL,
            intent_fingerprint TEXT NOT NULL,
            intent TEXT NOT NULL,
            principal TEXT NOT NULL,
            submitted_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            completed_at TEXT,
            http_status INTEGER,
            error TEXT,
            external_id TEXT,
            flow_id TEXT,
            retry_of TEXT REFERENCES receipts(operation_id),
            instance TEXT,
            response_status INTEGER,
            response_headers TEXT,
            response_body BLOB,
            response_truncated INTEGER
        )
        """
    )
    unresolved = ", ".join(f"'{s}'" for s in sorted(UNRESOLVED))
    db.execute(
        f"CREATE UNIQUE INDEX receipts_one_unresolved_per_fingerprint "
        f"ON receipts(intent_fingerprint) WHERE state IN ({unresolved})"
    )
    db.execute("CREATE INDEX receipts_by_fingerprint ON receipts(intent_fingerprint)")
    db.execute("CREATE INDEX receipts_by_state ON receipts(state)")
    db.execute(
        """
        CREATE TABLE receipt_events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            operation_id TEXT NOT NULL REFERENCES receipts(operation_id),
            at TEXT NOT NULL,
            event TEXT NOT NULL,
            from_state TEXT,
            to_state TEXT NOT NULL,
            reason TEXT NOT NULL,
            actor TEXT NOT NULL,
            flow_id TEXT
        )
        """
    )
    db.execute("CREATE INDEX receipt_events_by_receipt ON receipt_events(operation_id, id)")
    for op in ("UPDATE", "DELETE"):
        db.execute(
            f"CREATE TRIGGER receipt_events_no_{op.lower()} BEFORE {op} ON receipt_events "
            f"BEGIN SELECT RAISE(ABORT, 'receipt_events is append-only'); END"
        )


@migrations()
def m002_prunable_events_and_idempotency_keys(db: Database) -> None:
    # Events stay append-only while their receipt exists; `prune` removes the receipt first.
    db.execute("DROP TRIGGER receipt_events_no_delete")
    db.execute(
        "CREATE TRIGGER receipt_events_no_delete BEFORE DELETE ON receipt_events "
        "WHEN EXISTS (SELECT 1 FROM receipts WHERE operation_id = OLD.operation_id) "
        "BEGIN SELECT RAISE(ABORT, 'receipt_events is append-only'); END"
    )
    db.execute("ALTER TABLE receipts ADD COLUMN idempotency_key TEXT")
    db.execute("ALTER TABLE receipts ADD COLUMN client_key TEXT")
    db.execute("CREATE INDEX receipts_by_client_key ON receipts(client_key) WHERE client_key IS NOT NULL")
    db.execute("CREATE INDEX receipt_events_by_time ON receipt_events(at)")


@migrations()
def m003_awaiting_approval_is_unresolved(db: Database) -> None:
    db.execute("DROP INDEX receipts_one_unresolved_per_fingerprint")
    unresolved = ", ".join(f"'{s}'" for s in sorted(UNRESOLVED))
    db.execute(
        f"CREATE UNIQUE INDEX receipts_one_unresolved_per_fingerprint "
        f"ON receipts(intent_fingerprint) WHERE state IN ({unresolved})"
    )


@migrations()
def m004_when_an_idempotency_key_was_first_sent(db: Database) -> None:
    # A retry reuses its predecessor's key; an API forgets a key some time after it first saw it.
    db.execute("ALTER TABLE receipts ADD COLUMN idempotency_key_at TEXT")


_RECEIPT_COLUMNS = (
    "operation_id", "api", "operation", "method", "target", "state", "intent_fingerprint",
    "intent", "principal", "submitted_at", "updated_at", "flow_id", "retry_of", "instance",
    "idempotency_key", "client_key", "idempotency_key_at",
)
_UPDATABLE = frozenset(
    {"completed_at", "http_status", "error", "external_id", "response"}
)


def _create_private_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)


class Store:
    """The receipts database. Not thread-safe: give each thread its own Store, or one thread all calls."""

    def __init__(self, conn: sqlite3.Connection, *, clock: Clock = utcnow, path: str | None = None):
        self.db = Database(conn)
        self.conn = conn
        self.clock = clock
        self.path = path

    @classmethod
    def open(cls, path: str | Path, *, lock_timeout: float = 5.0, clock: Clock = utcnow, create: bool = True) -> Store:
        """Open (and create with mode 0600, and migrate) the receipts database at `path`."""
        p = Path(path).expanduser()
        try:
            if create:
                _create_private_file(p)
            elif not p.exists():
                raise StoreError(f"no receipts database at {p}")
            conn = sqlite3.connect(p, timeout=lock_timeout, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute(f"PRAGMA busy_timeout={int(lock_timeout * 1000)}")
            store = cls(conn, clock=clock, path=str(p))
            if create:
                # Switching a new file to WAL can fail with "locked" without waiting for the busy
                # timeout when other connections are opening it too: retry within lock_timeout.
                _retry_while_locked(lambda: store._setup(), lock_timeout)
            elif not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'receipts'").fetchone():
                conn.close()
                raise StoreError(f"{p} is not a receipts database")
        except sqlite3.Error as e:
            raise StoreUnavailable(f"cannot open the receipts database {p}: {e}") from e
        except OSError as e:
            raise StoreUnavailable(f"cannot create the receipts database {p}: {e.strerror}") from e
        return store

    def close(self) -> None:
        self.conn.close()

    def _setup(self) -> None:
        """WAL mode (persistent: readers need not set it) and pending migrations, serialized with every other opener."""
        self.conn.execute("PRAGMA journal_mode=WAL")
        if migrations.pending(self.db):
            # apply() re-reads what is pending inside the lock; its transactions nest as savepoints.
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                migrations.apply(self.db)
                self.conn.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise

    # --- transactions ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One `BEGIN IMMEDIATE` transaction: serialized with every other writer, even in other processes."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise StoreUnavailable(f"cannot write the receipts database: {e}") from e
        try:
            yield self.conn
            self.conn.execute("COMMIT")
        except BaseException as e:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            if isinstance(e, sqlite3.IntegrityError):
                raise
            if isinstance(e, sqlite3.Error):
                raise StoreUnavailable(f"cannot write the receipts database: {e}") from e
            raise

    def _event(self, operation_id: str, event: str, from_state: State | None, to_state: State,
               reason: str, actor: str, flow_id: str | None, at: str) -> None:
        self.conn.execute(
            "INSERT INTO receipt_events (operation_id, at, event, from_state, to_state, reason, actor, flow_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (operation_id, at, event, from_state, to_state, reason, actor, flow_id),
        )

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
        for _ in range(3):
            try:
                with self._write():
                    decision = self._begin_attempt(attempt, after_success, replay_window, actor)
                    record = record_duplicate(decision) if callable(record_duplicate) else record_duplicate
                    if decision.kind != "forward" and record:
                        r = decision.receipt
                        self._event(r.operation_id, "replayed" if decision.kind == "replay" else "blocked",
                                    r.state, r.state, decision.reason, actor, attempt.flow_id, iso(self.clock()))
                    return decision
            except sqlite3.IntegrityError:
                # Lost a race on the unique index to another connection: decide again.
                continue
        raise StoreUnavailable("could not record the attempt: the unique index kept refusing it")

    def _begin_attempt(self, a: Attempt, after_success: str, replay_window: float, actor: str) -> Decision:
        now = self.clock()
        at = iso(now)
        rows = self.conn.execute(
            "SELECT * FROM receipts WHERE intent_fingerprint = ? ORDER BY rowid DESC LIMIT 1",
            (a.intent_fingerprint,),
        )
        latest = _one_row(rows)
        if a.client_key:
            other = _one_row(self.conn.execute(
                "SELECT * FROM receipts WHERE client_key = ? AND intent_fingerprint != ? ORDER BY rowid DESC LIMIT 1",
                (a.client_key, a.intent_fingerprint),
            ))
            if other is not None:  # draft-ietf-httpapi-idempotency-key-header: a reused key, another request
                return Decision("key_conflict", other, "duplicate blocked: its Idempotency-Key was used for a different request")
        unresolved = self._unresolved_for(a.intent_fingerprint)
        if unresolved is not None:
            return Decision("blocked", unresolved, "duplicate blocked: the first attempt is unresolved")
        if after_success not in ("replay", "block", "allow"):
            raise ValueError(f"after_success must be replay, block or allow, not {after_success!r}")
        if latest is not None and latest.state is State.SUCCEEDED and after_success != "allow":
            if after_success == "block":
                return Decision("blocked_succeeded", latest, "duplicate blocked: the operation already succeeded")
            # updated_at: when it became succeeded (a terminal state, never updated again)
            age = (now - dt.datetime.fromisoformat(latest.updated_at)).total_seconds()
            if age <= replay_window:
                if not self._answered_success(latest.operation_id):
                    # Found by a read or resolved by hand: the recorded answer (a 5xx, an "already
                    # exists") is not the success, so it is never replayed as one.
                    return Decision("blocked_succeeded", latest, "duplicate blocked: succeeded (settled after the "
                                                                 "answer, which is not replayed)")
                if latest.response is not None and not latest.response.truncated:
                    return Decision("replay", latest, "duplicate answered with the recorded response")
                return Decision("blocked_succeeded", latest, "duplicate blocked: succeeded, and no complete response was recorded to replay")
            # older than the replay window: a new attempt
        retry_of = latest.operation_id if latest is not None else None
        if latest is not None and latest.state not in RETRYABLE and latest.state is not State.SUCCEEDED:
            raise StoreError(f"receipt {latest.operation_id} is in state {latest.state} with no unresolved index entry")
        operation_id = new_operation_id(now)
        first_state = State.AWAITING_APPROVAL if a.approval else State.SUBMITTED
        idempotency_key = idempotency_key_at = None
        if a.idempotency:
            # A retry of an attempt that provably did not happen reuses its key, so the server can
            # still deduplicate; after a success (after_success: allow) or a rejection, a new key.
            reuse = latest is not None and latest.state in (State.NOT_SENT, State.SAFE_TO_RETRY)
            fresh = str(uuid.uuid4()) if a.key_format == "uuid4" else f"receipt-{operation_id}"
            idempotency_key = a.given_key or (latest.idempotency_key if reuse else None) or fresh
            reused = latest is not None and idempotency_key == latest.idempotency_key
            idempotency_key_at = (latest.idempotency_key_at or latest.submitted_at) if reused else at
        values = (
            operation_id, a.api, a.operation, a.method, a.target, first_state,
            a.intent_fingerprint, json.dumps(a.intent, sort_keys=True), a.principal, at, at,
            a.flow_id, retry_of, a.instance, idempotency_key, a.client_key, idempotency_key_at,
        )
        self.conn.execute(
            f"INSERT INTO receipts ({', '.join(_RECEIPT_COLUMNS)}) VALUES ({', '.join('?' * len(values))})",
            values,
        )
        reason = f"new attempt, retry of {retry_of}" if retry_of else "new attempt"
        self._event(operation_id, "transition", None, first_state, reason, actor, a.flow_id, at)
        return Decision("forward", self.get(operation_id))

    def _answered_success(self, operation_id: str) -> bool:
        """Whether a succeeded receipt became so from the upstream's answer (submitted → succeeded)."""
        row = self.conn.execute(
            "SELECT from_state FROM receipt_events WHERE operation_id = ? AND event = 'transition' AND to_state = ? "
            "ORDER BY id DESC LIMIT 1",
            (operation_id, State.SUCCEEDED),
        ).fetchone()
        return row is not None and row[0] == State.SUBMITTED

    def _unresolved_for(self, fingerprint: str) -> Receipt | None:
        placeholders = ", ".join("?" * len(UNRESOLVED))
        rows = self.conn.execute(
            f"SELECT * FROM receipts WHERE intent_fingerprint = ? AND state IN ({placeholders})",
            (fingerprint, *sorted(UNRESOLVED)),
        )
        return _one_row(rows)

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
        Fields: completed_at, http_status, error, external_id, response (a RecordedResponse).
        """
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
        sets: dict[str, Any] = {"state": str(to)}
        for k, v in fields.items():
            if k == "response":
                if v is not None:
                    sets.update(
                        response_status=v.status, response_headers=json.dumps(v.headers),
                        response_body=v.body, response_truncated=int(v.truncated),
                    )
            else:
                sets[k] = v
        with self._write():
            self._step(operation_id, to, sources, sets, reason, actor, flow_id, set_completed="completed_at" not in fields)
        return self.get(operation_id)

    def _step(self, operation_id: str, to: State, sources: frozenset[State], sets: dict[str, Any],
              reason: str, actor: str, flow_id: str | None, *, set_completed: bool = True) -> State:
        """One guarded state change inside an open write transaction. Returns the state it left."""
        at = iso(self.clock())
        sets = {**sets, "state": str(to), "updated_at": at}
        row = _one_row(self.conn.execute("SELECT * FROM receipts WHERE operation_id = ?", (operation_id,)))
        if row is None:
            raise UnknownReceipt(f"no receipt {operation_id}")
        if row.state is State.SUBMITTED and set_completed:
            sets["completed_at"] = at  # the attempt is over, whatever we learned of it
        placeholders = ", ".join("?" * len(sources))
        cur = self.conn.execute(
            f"UPDATE receipts SET {', '.join(f'{k} = ?' for k in sets)} "
            f"WHERE operation_id = ? AND state IN ({placeholders})",
            (*sets.values(), operation_id, *sorted(sources)),
        )
        if cur.rowcount != 1:
            raise IllegalTransition(f"receipt {operation_id} is {row.state}; {row.state} → {to} is not allowed")
        self._event(operation_id, "transition", row.state, to, reason, actor, flow_id, at)
        return row.state

    # --- human decisions and reconciliation ------------------------------------------------

    def resolve(self, operation_id: str, to: State, *, note: str, actor: str,
                external_id: str | None = None) -> Receipt:
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
                self._step(operation_id, State.MANUAL_REVIEW, frozenset({current}), {},
                           f"taken into review: {note}", actor, None)
                current = State.MANUAL_REVIEW
            if current is not State.MANUAL_REVIEW:
                raise IllegalTransition(
                    f"receipt {operation_id} is {current}; only outcome_unknown and manual_review receipts are resolved by hand"
                )
            self._step(operation_id, to, frozenset({State.MANUAL_REVIEW}), fields, f"resolved by hand: {note}", actor, None)
        return self.get(operation_id)

    def claim_for_reconcile(self, operation_id: str, *, actor: str, reason: str = "reconciling with a read") -> Receipt:
        """`outcome_unknown`/`manual_review` → `reconciling`. Only one claimant wins; the others get IllegalTransition."""
        with self._write():
            self._step(operation_id, State.RECONCILING, frozenset({State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW}),
                       {}, reason, actor, None)
        return self.get(operation_id)

    # --- retention ----------------------------------------------------------------------------

    def prune(self, older_than: dt.timedelta, *, dry_run: bool = False) -> list[str]:
        """
        Delete resolved receipts (succeeded, rejected, not_sent, safe_to_retry) last changed
        more than `older_than` ago, with their events. Never an unresolved one, and never one
        that a kept receipt's `retry_of` still points at. Returns the deleted ids.
        """
        cutoff = iso(self.clock() - older_than)
        resolved = sorted(TERMINAL)
        with self._write() as conn:
            candidates = {
                r[0] for r in conn.execute(
                    f"SELECT operation_id FROM receipts WHERE updated_at < ? AND state IN ({', '.join('?' * len(resolved))})",
                    (cutoff, *resolved),
                )
            }
            links = conn.execute("SELECT operation_id, retry_of FROM receipts WHERE retry_of IS NOT NULL").fetchall()
            changed = True
            while changed:  # keep whatever a kept receipt points at
                changed = False
                for operation_id, retry_of in links:
                    if operation_id not in candidates and retry_of in candidates:
                        candidates.discard(retry_of)
                        changed = True
            ids = sorted(candidates)
            if ids and not dry_run:
                conn.execute("PRAGMA defer_foreign_keys = ON")
                for chunk in (ids[i : i + 500] for i in range(0, len(ids), 500)):
                    marks = ", ".join("?" * len(chunk))
                    conn.execute(f"DELETE FROM receipts WHERE operation_id IN ({marks})", chunk)
                    conn.execute(f"DELETE FROM receipt_events WHERE operation_id IN ({marks})", chunk)
        return ids

    # --- recovery --------------------------------------------------------------------------

    def recover_in_flight(self, *, is_alive: Callable[[str | None], bool], actor: str = "proxy") -> list[str]:
        """
        Receipts left `submitted` (or `reconciling`) by a proxy instance that is no longer
        running become `outcome_unknown`: the request may have left; `awaiting_approval` ones
        become `not_sent`: they never left. Returns their ids.
        """
        rows = self.conn.execute(
            "SELECT operation_id, state, instance FROM receipts WHERE state IN (?, ?, ?)",
            (State.SUBMITTED, State.RECONCILING, State.AWAITING_APPROVAL),
        ).fetchall()
        recovered = []
        outcomes = {
            State.SUBMITTED: (State.OUTCOME_UNKNOWN, "proxy stopped while the request was in flight"),
            State.RECONCILING: (State.OUTCOME_UNKNOWN, "proxy stopped while reconciling"),
            State.AWAITING_APPROVAL: (State.NOT_SENT, "proxy stopped while the request awaited approval"),
        }
        for operation_id, state, instance in rows:
            if is_alive(instance):
                continue
            to, reason = outcomes[State(state)]
            try:
                self.transition(operation_id, to, reason=reason, actor=actor, expect=[State(state)], error=reason)
            except IllegalTransition:
                continue  # another process moved it on meanwhile
            recovered.append(operation_id)
        return recovered

    # --- reads -----------------------------------------------------------------------------

    def latest_for(self, fingerprint: str) -> Receipt | None:
        """The newest receipt with this intent fingerprint, or None."""
        return _one_row(self.conn.execute(
            "SELECT * FROM receipts WHERE intent_fingerprint = ? ORDER BY rowid DESC LIMIT 1", (fingerprint,)))

    def get(self, operation_id: str) -> Receipt:
        row = _one_row(self.conn.execute("SELECT * FROM receipts WHERE operation_id = ?", (operation_id,)))
        if row is None:
            raise UnknownReceipt(f"no receipt {operation_id}")
        return row

    def list(self, *, states: Sequence[State] = (), operation: str | None = None, since: str | None = None,
             limit: int | None = 100) -> list[Receipt]:
        """Receipts, newest first. `operation` is a name (`articles.create`) or `api/name`; `since` an ISO time."""
        where, params = self._filters(states, operation, since)
        sql = f"SELECT * FROM receipts{where} ORDER BY rowid DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [Receipt.from_row(r) for r in self.db.query(sql, params)]

    def _filters(self, states: Sequence[State], operation: str | None, since: str | None) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if states:
            clauses.append(f"state IN ({', '.join('?' * len(states))})")
            params += [str(s) for s in states]
        if operation:
            clauses.append("(operation = ? OR api || '/' || operation = ?)")
            params += [operation, operation]
        if since:
            clauses.append("submitted_at >= ?")
            params.append(since)
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params

    def changed_since(self, at: str, *, limit: int = 500) -> list[Receipt]:
        """Receipts whose state changed after `at` (an ISO time), oldest change first."""
        return [Receipt.from_row(r) for r in self.db.query(
            "SELECT * FROM receipts WHERE updated_at > ? ORDER BY updated_at LIMIT ?", [at, limit])]

    def duplicates(self, *, since: str | None = None, limit: int | None = 100) -> list[tuple[Event, Receipt]]:
        """Blocked and replayed duplicates, newest first, each with the receipt it was checked against."""
        sql = "SELECT * FROM receipt_events WHERE event IN ('blocked', 'replayed')"
        params: list[Any] = []
        if since:
            sql += " AND at >= ?"
            params.append(since)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        events = [_event_of(r) for r in self.db.query(sql, params)]
        receipts = {i: self.get(i) for i in {e.operation_id for e in events}}
        return [(e, receipts[e.operation_id]) for e in events]

    def export(self, *, since: str | None = None) -> Iterator[tuple[Receipt, list[Event]]]:
        """Every receipt (oldest first) with its events, for audit."""
        where, params = self._filters((), None, since)
        for row in self.db.query(f"SELECT * FROM receipts{where} ORDER BY rowid", params):
            receipt = Receipt.from_row(row)
            yield receipt, self.events(receipt.operation_id)

    def events(self, operation_id: str) -> list[Event]:
        return [
            _event_of(r)
            for r in self.db.query("SELECT * FROM receipt_events WHERE operation_id = ? ORDER BY id", [operation_id])
        ]

    def duplicate_counts(self, operation_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        """How many duplicates of each receipt were blocked or replayed: {id: {"blocked": n, "replayed": m}}."""
        out: dict[str, dict[str, int]] = {i: {"blocked": 0, "replayed": 0} for i in operation_ids}
        if operation_ids:
            rows = self.conn.execute(
                f"SELECT operation_id, event, count(*) FROM receipt_events WHERE event IN ('blocked', 'replayed') "
                f"AND operation_id IN ({', '.join('?' * len(operation_ids))}) GROUP BY operation_id, event",
                list(operation_ids),
            )
            for operation_id, event, n in rows:
                out[operation_id][event] = n
        return out

    def counts(self) -> dict[str, int]:
        return {r["state"]: r["n"] for r in self.db.query("SELECT state, count(*) AS n FROM receipts GROUP BY state")}


def _event_of(r: dict[str, Any]) -> Event:
    return Event(
        id=r["id"], operation_id=r["operation_id"], at=r["at"], event=r["event"],
        from_state=State(r["from_state"]) if r["from_state"] else None,
        to_state=State(r["to_state"]), reason=r["reason"], actor=r["actor"], flow_id=r["flow_id"],
    )


def _retry_while_locked(fn: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _one_row(cursor: sqlite3.Cursor) -> Receipt | None:
    row = cursor.fetchone()
    if row is None:
        return None
    names = [d[0] for d in cursor.description]
    return Receipt.from_row(dict(zip(names, row)))
