"""
The reads every backend shares: one receipt, the newest for a fingerprint, lists, changes,
duplicates, the audit export, events, counts, what enforcement did or would have done (observe mode),
and operators' decisions on held writes.
Only `_rows` (see base.py) runs their SQL.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
from typing import Any

from proxy_addon.errors import UnknownReceipt
from proxy_addon.states import State
from proxy_addon.store.base import Backend, marks
from proxy_addon.store.records import WOULD_HAVE, ApprovalDecision, Enforcement, Event, Example, Receipt

_PAGE = 500  # receipts per export query, ids per query of decisions


class ReceiptReads(Backend):
    """Queries over `receipts` and `receipt_events`; a failed read raises StoreError."""

    def get(self, operation_id: str) -> Receipt:
        receipt = self._receipt("SELECT * FROM receipts WHERE operation_id = ?", (operation_id,))
        if receipt is None:
            raise UnknownReceipt(f"no receipt {operation_id}")
        return receipt

    def latest_for(self, fingerprint: str) -> Receipt | None:
        """The newest receipt with this intent fingerprint, or None."""
        return self._receipt(
            f"SELECT * FROM receipts WHERE intent_fingerprint = ? ORDER BY {self.dialect.insertion_order} DESC LIMIT 1",
            (fingerprint,),
        )

    def list(
        self,
        *,
        states: Sequence[State] = (),
        operation: str | None = None,
        since: str | None = None,
        limit: int | None = 100,
    ) -> list[Receipt]:
        """Receipts, newest first. `operation` is a name (`articles.create`) or `api/name`; `since` an ISO time."""
        pages = self.list_pages(states=states, operation=operation, since=since, limit=limit)
        return [r for page in pages for r in page]

    def list_pages(
        self,
        *,
        states: Sequence[State] = (),
        operation: str | None = None,
        since: str | None = None,
        limit: int | None = 100,
    ) -> Iterator[builtins.list[Receipt]]:
        """
        `list`'s receipts, newest first, a page at a time (one query each, at most _PAGE
        receipts): however many match, only a page is held at once, as `export` reads them.
        """
        order = self.dialect.insertion_order
        before: Any = None
        left = limit
        while left is None or left > 0:
            size = _PAGE if left is None else min(left, _PAGE)
            clauses, params = _filters(states, operation, since)
            if before is not None:
                clauses.append(f"{order} < ?")
                params.append(before)
            where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
            rows = self._rows(
                f"SELECT *, {order} AS list_position FROM receipts{where} ORDER BY {order} DESC LIMIT ?",
                (*params, size),
            )
            if rows:
                yield [Receipt.from_row(r) for r in rows]
            if len(rows) < size:
                return
            before = rows[-1]["list_position"]
            left = None if left is None else left - len(rows)

    # Below, `list` is the method above: the builtin is `builtins.list`.
    def transitions_after(self, event_id: int, *, limit: int = 500) -> builtins.list[tuple[int, str]]:
        """
        The state changes recorded after the event `event_id`, oldest first: each transition
        event's id and receipt id. A search of the events' primary key (every state change
        writes an event), never a scan of the receipts.
        """
        rows = self._rows(
            "SELECT id, operation_id FROM receipt_events WHERE id > ? AND event = 'transition' ORDER BY id LIMIT ?",
            (event_id, limit),
        )
        return [(r["id"], r["operation_id"]) for r in rows]

    def last_event_id(self) -> int:
        """The id of the newest event (0 when there is none)."""
        return self._rows("SELECT max(id) AS id FROM receipt_events")[0]["id"] or 0

    def duplicates(self, *, since: str | None = None, limit: int | None = 100) -> builtins.list[tuple[Event, Receipt]]:
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
        events = [Event.from_row(r) for r in self._rows(sql, params)]
        receipts = {i: self.get(i) for i in {e.operation_id for e in events}}
        return [(e, receipts[e.operation_id]) for e in events]

    def export(
        self, *, since: str | None = None, with_events: bool = True
    ) -> Iterator[tuple[Receipt, builtins.list[Event]]]:
        """Every receipt (oldest first) with its events (or none), for audit. Reads a page of receipts at a time."""
        order = self.dialect.insertion_order
        after: Any = None
        while True:
            clauses, params = _filters((), None, since)
            if after is not None:
                clauses.append(f"{order} > ?")
                params.append(after)
            where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
            page = self._rows(
                f"SELECT *, {order} AS export_position FROM receipts{where} ORDER BY {order} LIMIT ?", (*params, _PAGE)
            )
            for row in page:
                receipt = Receipt.from_row(row)
                yield receipt, self.events(receipt.operation_id) if with_events else []
            if len(page) < _PAGE:
                return
            after = page[-1]["export_position"]

    def events(self, operation_id: str) -> builtins.list[Event]:
        return [
            Event.from_row(r)
            for r in self._rows("SELECT * FROM receipt_events WHERE operation_id = ? ORDER BY id", (operation_id,))
        ]

    def duplicate_counts(
        self, operation_ids: Sequence[str], kinds: Sequence[str] = ("blocked", "replayed")
    ) -> dict[str, dict[str, int]]:
        """
        How many events of `kinds` each receipt has: by default its duplicates blocked or replayed,
        {id: {"blocked": n, "replayed": m}}; observe mode's are WOULD_HAVE and DUPLICATE_SENT (records.py).
        """
        out: dict[str, dict[str, int]] = {i: dict.fromkeys(kinds, 0) for i in operation_ids}
        if operation_ids:
            rows = self._rows(
                f"SELECT operation_id, event, count(*) AS n FROM receipt_events WHERE event IN ({marks(len(kinds))}) "
                f"AND operation_id IN ({marks(len(operation_ids))}) GROUP BY operation_id, event",
                [*kinds, *operation_ids],
            )
            for r in rows:
                out[r["operation_id"]][r["event"]] = r["n"]
        return out

    def approval_decision(self, operation_id: str) -> ApprovalDecision | None:
        """The operator's decision recorded on a receipt (`receipts approve` / `deny`), used or not; None if none."""
        rows = self._rows("SELECT * FROM approval_decisions WHERE operation_id = ?", (operation_id,))
        return ApprovalDecision.from_row(rows[0]) if rows else None

    def approval_decisions(self, operation_ids: Sequence[str]) -> dict[str, ApprovalDecision]:
        """The decisions recorded and not used yet on these receipts: {id: decision}."""
        out: dict[str, ApprovalDecision] = {}
        ids = builtins.list(operation_ids)
        for chunk in (ids[i : i + _PAGE] for i in range(0, len(ids), _PAGE)):
            rows = self._rows(
                f"SELECT * FROM approval_decisions WHERE consumed_at IS NULL AND operation_id IN ({marks(len(chunk))})",
                chunk,
            )
            out.update((r["operation_id"], ApprovalDecision.from_row(r)) for r in rows)
        return out

    def counts(self) -> dict[str, int]:
        return {r["state"]: r["n"] for r in self._rows("SELECT state, count(*) AS n FROM receipts GROUP BY state")}

    def enforcement_since(self, since: str, examples: int = 3) -> Enforcement:
        """
        What enforcement did, or in observe mode would have done, since `since` (an ISO time), by api
        and operation: the receipts written, the counts of each kind of `_ENFORCEMENT_KIND`, and the
        newest `examples` events of each (over the index on events' time, and on receipts' submitted_at).
        """
        writes = self._rows(
            "SELECT api, operation, count(*) AS n FROM receipts WHERE submitted_at >= ? GROUP BY api, operation",
            (since,),
        )
        counts = self._rows(
            f"SELECT r.api, r.operation, {_ENFORCEMENT_KIND} AS kind, count(*) AS n {_ENFORCEMENT_EVENTS} "
            "GROUP BY r.api, r.operation, kind",
            (since,),
        )
        latest = self._rows(
            "SELECT * FROM (SELECT r.api, r.operation, e.operation_id, e.at, e.reason, "
            f"{_ENFORCEMENT_KIND} AS kind, ROW_NUMBER() OVER (PARTITION BY r.api, r.operation, {_ENFORCEMENT_KIND} "
            f"ORDER BY e.id DESC) AS nth {_ENFORCEMENT_EVENTS}) newest WHERE nth <= ? ORDER BY api, operation, at DESC",
            (since, examples),
        )
        return Enforcement(
            writes={(w["api"], w["operation"]): w["n"] for w in writes},
            counts={(c["api"], c["operation"], c["kind"]): c["n"] for c in counts},
            examples=[
                (x["api"], x["operation"], x["kind"], Example(x["operation_id"], x["at"], x["reason"])) for x in latest
            ],
        )

    def counts_by_operation(self, states: Sequence[State]) -> dict[tuple[str, str, State], int]:
        """
        How many receipts are in each of `states`, by api and operation: {(api, operation, state): n}.
        One query over the index on `state` (receipts_by_state): it reads only the receipts in those states.
        """
        if not states:
            return {}
        rows = self._rows(
            f"SELECT api, operation, state, count(*) AS n FROM receipts WHERE state IN ({marks(len(states))}) "
            "GROUP BY api, operation, state",
            [str(s) for s in states],
        )
        return {(r["api"], r["operation"], State(r["state"])): r["n"] for r in rows}


# What enforcement did, as events (`enforcement_since`): a duplicate blocked or replayed (its original's
# event), a write held for approval, denied by a decision or refused over a budget (its receipt's first
# transition, store/attempts.py `_refusal`); observe mode's WOULD_HAVE events say what it would have done.
# `kind`: the event's, or held / refused / denied.
_ENFORCEMENT_KIND = (
    "CASE WHEN e.event <> 'transition' THEN e.event WHEN e.to_state = 'awaiting_approval' THEN 'held' "
    "WHEN substr(e.reason, 1, 12) = 'over budget:' THEN 'refused' ELSE 'denied' END"
)
_ENFORCEMENT_EVENTS = (
    "FROM receipt_events e JOIN receipts r ON r.operation_id = e.operation_id WHERE e.at >= ? AND "
    f"(e.event IN ('blocked', 'replayed', {', '.join(repr(k) for k in WOULD_HAVE)}) OR (e.event = 'transition' "
    "AND e.from_state IS NULL AND e.to_state IN ('awaiting_approval', 'rejected')))"
)


def _filters(states: Sequence[State], operation: str | None, since: str | None) -> tuple[list[str], list[Any]]:
    """WHERE clauses (to join with AND) and their parameters for `list` and `export`."""
    clauses: list[str] = []
    params: list[Any] = []
    if states:
        clauses.append(f"state IN ({marks(len(states))})")
        params += [str(s) for s in states]
    if operation:
        clauses.append("(operation = ? OR api || '/' || operation = ?)")
        params += [operation, operation]
    if since:
        clauses.append("submitted_at >= ?")
        params.append(since)
    return clauses, params
