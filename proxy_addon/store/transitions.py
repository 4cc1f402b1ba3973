"""
Guarded transitions, the one way a receipt changes state: `transition` (and `record_outcome`,
a forwarded write's outcome, not waiting for the disk) and `_step`, the guarded UPDATE with its
event, that every other write of the store uses. Each state change is told to the store's
`observer` once its transaction commits (`_settled`, which the backend's `_write` calls).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from typing import Any

from proxy_addon.errors import IllegalTransition, StoreError, UnknownReceipt
from proxy_addon.states import TRANSITIONS, State, sources_of
from proxy_addon.store.base import marks
from proxy_addon.store.budgets import GIVES_BACK, ReceiptBudgets
from proxy_addon.store.hash_chain import ReceiptChain
from proxy_addon.store.queries import ReceiptReads
from proxy_addon.store.records import Receipt, RecordedResponse, iso, state_of
from proxy_addon.store.sealing import AnswerSeal

_UPDATABLE = frozenset(
    {"completed_at", "http_status", "error", "external_id", "response", "failed_reads", "next_read_at"}
)

logger = logging.getLogger("proxy_addon.store.receipts")  # the name it logged under before the split

# Told of each state change the store commits: (api, operation, the state left (None: a new receipt), the state entered)
Observer = Callable[[str, str, State | None, State], None]


class ReceiptTransitions(ReceiptReads, ReceiptBudgets, ReceiptChain):
    """Guarded state changes, their events, and the observer told of them: what every other write uses."""

    observer: Observer | None = None  # the proxy's metrics (gate/metrics.py): every state change, once committed
    # Seals each answer recorded (sealing.py), and opens one to replay: the Installation sets it
    # from secret.key. A store without it records no answer (StoreError), and replays none.
    answer_seal: AnswerSeal | None = None
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
        self._chain_ended()
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
        """Append an event to the receipt's history, and to the database's hash chain (hash_chain.py)."""
        self._append_event(
            {
                "operation_id": operation_id,
                "at": at,
                "event": event,
                "from_state": from_state,
                "to_state": to_state,
                "reason": reason,
                "actor": actor,
                "flow_id": flow_id,
            }
        )

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
        Fields: completed_at, http_status, error, external_id, response (a RecordedResponse,
        sealed with `answer_seal`), failed_reads and next_read_at (what reconcile records of its reads).
        """
        return self._transition(operation_id, to, reason, actor, expect, flow_id, fields, durable=True)

    def record_outcome(
        self,
        operation_id: str,
        to: State,
        *,
        reason: str,
        flow_id: str | None = None,
        without_waiting: bool = False,
        **fields: Any,
    ) -> Receipt:
        """
        A forwarded write's outcome: `submitted` → `to`, as `transition(..., expect=[SUBMITTED])`,
        committed without waiting for the disk. An OS crash may lose it, and then the receipt
        is `submitted` again, which recovery makes `outcome_unknown` (base.py, "Durability").
        `without_waiting` (where `snapshot_writes`: the event loop's SQLite connection): in a
        `_snapshot_write`, so WouldWait, with nothing written, when another writer holds the
        lock or wrote since the receipt was read.
        """
        return self._transition(
            operation_id,
            to,
            reason,
            "proxy",
            [State.SUBMITTED],
            flow_id,
            fields,
            durable=False,
            snapshot=without_waiting,
        )

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
        snapshot: bool = False,
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
        sets: dict[str, Any] = {k: v for k, v in fields.items() if k != "response"}
        if fields.get("response") is not None:  # its status is http_status, bound to it (sealing.py)
            sets.update(self._sealed(operation_id, fields["response"]))
        with self._snapshot_write() if snapshot else self._write(durable=durable, receipt=operation_id):
            return self._step(
                operation_id, to, sources, sets, reason, actor, flow_id, set_completed="completed_at" not in fields
            )

    def _sealed(self, operation_id: str, response: RecordedResponse) -> dict[str, Any]:
        """The response columns of a recorded answer, sealed: never written in clear."""
        if self.answer_seal is None:
            raise StoreError(
                f"cannot record the answer of receipt {operation_id} in {self.location}: this store has no key to "
                "encrypt it with (answer_seal, set from secret.key when the proxy opens it)"
            )
        return self.answer_seal.columns(operation_id, response)

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
        now = self.clock()
        at = iso(now)
        sets = {**sets, "state": str(to), "updated_at": at}
        rows = self._rows("SELECT * FROM receipts WHERE operation_id = ?", (operation_id,))
        if not rows:
            raise UnknownReceipt(f"no receipt {operation_id}")
        old = rows[0]
        was = state_of(old["state"], f"receipt {operation_id}")  # the row is made a Receipt once: as updated
        if was is State.SUBMITTED and set_completed:
            sets["completed_at"] = at  # the attempt is over, whatever we learned of it
        if was is State.SUBMITTED and to is not State.SUBMITTED:
            sets.update(waiting_for=None, waiting_until=None)  # settled: it waits for nothing (store/rounds.py)
        if to is State.SUBMITTED and old.get("upstream_timeout") is not None:  # approved: it is sent from now
            sets["in_flight_until"] = iso(now + dt.timedelta(seconds=old["upstream_timeout"]))
        changed = self._execute(
            f"UPDATE receipts SET {', '.join(f'{k} = ?' for k in sets)} "
            f"WHERE operation_id = ? AND state IN ({marks(len(sources))})",
            (*sets.values(), operation_id, *sorted(sources)),
        )
        if changed != 1:
            raise IllegalTransition(f"receipt {operation_id} is {was}; {was} → {to} is not allowed")
        self._event(operation_id, "transition", was, to, reason, actor, flow_id, at)
        if to in GIVES_BACK:  # proven not done: its share of its budgets comes back (store/budgets.py)
            self._give_back(operation_id)
        self._changed(old["api"], old["operation"], was, to)
        return Receipt.from_row({**old, **sets})  # what the UPDATE wrote, not read back
