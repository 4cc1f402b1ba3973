"""
The events' hash chain in the database (docs/proof.md): every event is appended here, chained.

`_append_event(fields)` is the one way an event is appended (transitions.py's `_event` calls it):

- SQLite: it gives the event its id, the next position of the database's one chain (`chain_seq`),
  the hash of the record before it (`prev_hash`) and its own (`hash`: proof/chain_links.py), and
  inserts it. A write transaction is the only writer of the file (BEGIN IMMEDIATE; a snapshot write
  fails with WouldWait when anything committed since its read), so the tip it reads stays the tip;
  it is read at the transaction's first record and kept in `_chain_tip` until the transaction ends
  (`_settled` forgets it).
- PostgreSQL (postgres.py): the events are inserted with the COMMIT, in one round trip, and the
  trigger CHAIN_TRIGGER (m017) takes CHAIN_LOCK, an advisory lock held to the transaction's end,
  reads the tip once it holds it, and gives the event its id, position and hashes in the database:
  the chain's order is the order in which event-appending transactions commit, and ids follow it.

The reads `receipts verify` needs (`chain_records`, `receipt_states`) and the chain's marks
(where it starts, ranges pruned: `_mark`) are here too.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any, ClassVar

from proxy_addon.proof.chain_links import GENESIS, record_hash
from proxy_addon.store.base import Backend

_PAGE = 2000
CHAIN_LOCK = 0x5EC1E9  # PostgreSQL: the advisory lock that gives the chain its one order (postgres.py)
# The chain's last position and hash: the last event's, or a mark's when one ends the chain (both indexed).
TIP_SQL = (
    "SELECT chain_seq AS pos, hash FROM receipt_events WHERE chain_seq = (SELECT max(chain_seq) FROM receipt_events) "
    "UNION ALL SELECT through AS pos, hash FROM receipt_chain_marks "
    "WHERE through = (SELECT max(through) FROM receipt_chain_marks)"
)

# PostgreSQL: the trigger that chains each event as it is inserted (m017), in the database, so that
# CHAIN_LOCK is held only from the INSERT, sent with the COMMIT in one round trip, to the commit's
# end (postgres.py). The same canonical form as proof/chain_links.py: the row as JSON, `hash` and
# null fields left out, members in code unit order (every column name is ASCII, so "C" order is
# UTF-16 order), strings escaped by PostgreSQL's escape_json exactly as RFC 8785 escapes them
# (\" \\ \b \f \n \r \t, other controls as \u00xx, nothing else), integers as digits.
CHAIN_TRIGGER = f"""
CREATE FUNCTION receipt_events_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE tip_pos BIGINT; tip_hash TEXT; canon TEXT;
BEGIN
    PERFORM pg_advisory_xact_lock({CHAIN_LOCK});
    SELECT pos, hash INTO tip_pos, tip_hash FROM ({TIP_SQL}) AS tip ORDER BY pos DESC LIMIT 1;
    NEW.id := nextval('receipt_events_id_seq');
    NEW.chain_seq := coalesce(tip_pos, 0) + 1;
    NEW.prev_hash := coalesce(tip_hash, repeat('0', 64));
    SELECT '{{' || string_agg(to_json(key)::text || ':' || value::text, ',' ORDER BY key COLLATE "C") || '}}'
        INTO canon FROM jsonb_each(to_jsonb(NEW) - 'hash') WHERE jsonb_typeof(value) <> 'null';
    NEW.hash := encode(sha256(convert_to(canon, 'UTF8')), 'hex');
    RETURN NEW;
END $$
"""


def tip_of(rows: list[dict[str, Any]]) -> tuple[int, str]:
    """The chain's tip from TIP_SQL's rows: (0, GENESIS) for an empty chain."""
    best = max(rows, key=lambda r: r["pos"], default=None)
    return (int(best["pos"]), str(best["hash"])) if best else (0, GENESIS)


class ReceiptChain(Backend):
    """Appending events to the chain, and reading the chain back in order."""

    # SQL for the next event id (SQLite's, under the write lock; the AUTOINCREMENT's next value).
    next_event_id: ClassVar[str] = (
        "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'receipt_events'), 0), "
        "coalesce((SELECT max(id) FROM receipt_events), 0)) + 1 AS id"
    )
    _chain_tip: tuple[int, str] | None = None  # (position, hash) after the open transaction's last record

    def _chain_start(self) -> tuple[int, str, int]:
        """At a transaction's first record: (the tip's position, its hash, the next event id). SQLite's."""
        pos, prev = tip_of(self._rows(TIP_SQL))
        return pos, prev, int(self._rows(self.next_event_id)[0]["id"])

    def _chain_next(self) -> tuple[int, str, int]:
        """The next record's (position, prev_hash, event id)."""
        if self._chain_tip is None:
            pos, prev, event_id = self._chain_start()
        else:
            (pos, prev), event_id = self._chain_tip, int(self._rows(self.next_event_id)[0]["id"])
        return pos + 1, prev, event_id

    def _append_event(self, fields: dict[str, Any]) -> None:
        """Insert an event (its columns but id and the chain's), chained; inside a write transaction."""
        pos, prev, event_id = self._chain_next()
        row = {"id": event_id, "chain_seq": pos, "prev_hash": prev, **fields}
        row["hash"] = record_hash(row)
        self._execute(
            f"INSERT INTO receipt_events ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
            tuple(row.values()),
        )
        self._chain_tip = (pos, row["hash"])

    def _mark(self, mark: str, detail: str, at: str, *, through: int | None = None, hash: str | None = None) -> None:
        """
        Append a chain mark; `through` and `hash` (a pruned range): it stands for the records up to
        `through`, whose last hash it keeps. Inside a write transaction.
        """
        pos, prev, _ = self._chain_next()
        row: dict[str, Any] = {"chain_seq": pos, "through": through or pos, "at": at, "mark": mark, "detail": detail}
        row["prev_hash"] = prev
        row["hash"] = hash or record_hash(row)
        self._execute(
            f"INSERT INTO receipt_chain_marks ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
            tuple(row.values()),
        )
        self._chain_tip = (int(row["through"]), row["hash"])

    def _leave_links(self, events: list[dict[str, Any]], at: str) -> int:
        """
        Before `prune` deletes `events` (rows with chain_seq, prev_hash, hash): one `pruned` mark per
        run of consecutive positions, keeping the run's first prev_hash and last hash, so that the
        records around it still link. A run ends at each signed checkpoint's position, so that every
        checkpoint still checks against the hash kept there. Returns how many marks.
        """
        signed = {int(r["size"]) for r in self._rows("SELECT size FROM receipt_checkpoints")}
        runs: list[list[dict[str, Any]]] = []
        for e in sorted((e for e in events if e["chain_seq"] is not None), key=lambda e: e["chain_seq"]):
            last = runs[-1][-1]["chain_seq"] if runs else None
            if last is not None and last + 1 == e["chain_seq"] and last not in signed:
                runs[-1].append(e)
            else:
                runs.append([e])
        for run in runs:
            first, last = run[0], run[-1]
            self._execute(
                "INSERT INTO receipt_chain_marks (chain_seq, through, at, mark, detail, prev_hash, hash) "
                "VALUES (?, ?, ?, 'pruned', ?, ?, ?)",
                (
                    first["chain_seq"],
                    last["chain_seq"],
                    at,
                    f"{len(run)} events pruned; the hash of the last one is kept",
                    first["prev_hash"],
                    last["hash"],
                ),
            )
        return len(runs)

    def _chain_ended(self) -> None:
        """The write transaction ended: the next one reads the tip again."""
        self._chain_tip = None

    def chain_tip(self) -> tuple[int, str]:
        """The committed chain's last position and hash."""
        return tip_of(self._rows(TIP_SQL))

    def chain_records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """
        Every record of the chain, by position: ("event", row) or ("mark", row), a page at a time;
        then the events with no position (none, unless written around the proxy).
        """
        marks = (("mark", r) for r in self._rows("SELECT * FROM receipt_chain_marks ORDER BY chain_seq"))
        yield from heapq.merge(self._chained_events(), marks, key=lambda record: int(record[1]["chain_seq"]))
        yield from (("event", r) for r in self._rows("SELECT * FROM receipt_events WHERE chain_seq IS NULL"))

    def _chained_events(self) -> Iterator[tuple[str, dict[str, Any]]]:
        after = 0
        while page := self._rows(
            "SELECT * FROM receipt_events WHERE chain_seq > ? ORDER BY chain_seq LIMIT ?", (after, _PAGE)
        ):
            yield from (("event", row) for row in page)
            after = page[-1]["chain_seq"]

    def receipt_states(self) -> Iterator[tuple[str, str]]:
        """Every receipt's (id, state), a page at a time."""
        after = ""
        while page := self._rows(
            "SELECT operation_id, state FROM receipts WHERE operation_id > ? ORDER BY operation_id LIMIT ?",
            (after, _PAGE),
        ):
            yield from ((r["operation_id"], r["state"]) for r in page)
            after = page[-1]["operation_id"]
