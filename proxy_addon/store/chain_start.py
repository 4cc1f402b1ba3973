"""
Where a database's hash chain starts (migration m017): the events written before it are chained
once, in id order, from their rows as they are then, and a `chain_started` mark follows them,
recording when and how many. What was done to an event before that moment cannot be shown
(docs/proof.md, "Where the chain starts").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy_addon.proof.chain_links import GENESIS, record_hash
from proxy_addon.store.records import iso, utcnow

if TYPE_CHECKING:
    from proxy_addon.store.migrations import Schema

_PAGE = 1000
_TRIGGER = "receipt_events_no_update"


def chain_history(db: Schema) -> None:
    """Chain every event (the update trigger lifted meanwhile), then append the `chain_started` mark."""
    _without_update_trigger(db, lift=True)
    position, prev, after = 0, GENESIS, -1
    while page := db.rows("SELECT * FROM receipt_events WHERE id > ? ORDER BY id LIMIT ?", (after, _PAGE)):
        for row in page:
            position += 1
            row.update(chain_seq=position, prev_hash=prev)
            prev = record_hash(row)
            db.execute(
                "UPDATE receipt_events SET chain_seq = ?, prev_hash = ?, hash = ? WHERE id = ?",
                (position, row["prev_hash"], prev, row["id"]),
            )
        after = page[-1]["id"]
    _without_update_trigger(db, lift=False)
    mark = {
        "chain_seq": position + 1,
        "through": position + 1,
        "at": iso(utcnow()),
        "mark": "chain_started",
        "detail": f"the chain starts here; the {position} events before were chained by migration m017 as they were",
        "prev_hash": prev,
    }
    mark["hash"] = record_hash(mark)
    db.execute(
        f"INSERT INTO receipt_chain_marks ({', '.join(mark)}) VALUES ({', '.join('?' * len(mark))})",
        tuple(mark.values()),
    )


def _without_update_trigger(db: Schema, *, lift: bool) -> None:
    """Drop (`lift`) or create again m001's trigger that refuses an UPDATE of an event."""
    on = " ON receipt_events" if db.postgres else ""
    if lift:
        db.execute(f"DROP TRIGGER {_TRIGGER}{on}")
    elif db.postgres:
        db.execute(
            f"CREATE TRIGGER {_TRIGGER} BEFORE UPDATE ON receipt_events "
            "FOR EACH ROW EXECUTE FUNCTION receipt_events_append_only()"
        )
    else:
        db.execute(
            f"CREATE TRIGGER {_TRIGGER} BEFORE UPDATE ON receipt_events "
            "BEGIN SELECT RAISE(ABORT, 'receipt_events is append-only'); END"
        )
