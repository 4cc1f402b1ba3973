"""
How long `receipts verify` takes for a big history (docs/proof.md, "Costs"): a SQLite database with
EVENTS chained events (4 per receipt: new, succeeded, a duplicate blocked, one replayed), built directly
(the chain computed here as the store computes it, the rows inserted in bulk), then verified from the
database and from its `export --signed` bundle, timed.

    .venv/bin/python -m bench.verify_bench [EVENTS]     # default 1000000
"""

from __future__ import annotations

import io
import sys
import tempfile
import time
from pathlib import Path

from proxy_addon.cli.verify_command import audit_store
from proxy_addon.proof.bundle_lines import bundle_lines, verify_bundle
from proxy_addon.proof.chain_links import record_hash
from proxy_addon.store import SQLiteStore

STEPS = [
    (None, "submitted", "transition"),
    ("submitted", "succeeded", "transition"),
    ("succeeded", "succeeded", "blocked"),
    ("succeeded", "succeeded", "replayed"),
]


def build(path: Path, events: int) -> SQLiteStore:
    store = SQLiteStore.open(path)
    pos, prev = store.chain_tip()
    receipts: list[tuple[str, ...]] = []
    rows: list[tuple[object, ...]] = []
    n = 0
    while len(rows) < events:
        op = f"20260101T000000Z-{n:010x}"
        at = f"2026-01-01T00:00:{n % 60:02d}.000000Z"
        receipts.append((op, "a", "o", "POST", "https://a/b", "succeeded", f"fp-{n}", "{}", "p", at, at))
        for frm, to, kind in STEPS:
            pos += 1
            row = {"id": pos, "chain_seq": pos, "prev_hash": prev, "operation_id": op, "at": at, "event": kind,
                   "from_state": frm, "to_state": to,
                   "reason": "bench", "actor": "proxy", "flow_id": None}  # fmt: skip
            row["hash"] = prev = record_hash(row)
            rows.append(tuple(row.values()))
        n += 1
    conn = store.conn
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO receipts (operation_id, api, operation, method, target, state, intent_fingerprint, intent, "
        "principal, submitted_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        receipts,
    )
    conn.executemany(
        "INSERT INTO receipt_events (id, chain_seq, prev_hash, operation_id, at, event, from_state, to_state, reason, "
        "actor, flow_id, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    conn.execute("COMMIT")
    return store


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        store = build(Path(d) / "receipts.db", events)
        t1 = time.perf_counter()
        line = audit_store(store).line()
        t2 = time.perf_counter()
        buf = io.StringIO()
        no_decisions: list[dict] = []
        receipts = (({"operation_id": o, "state": s}, no_decisions) for o, s in store.receipt_states())
        for text in bundle_lines(None, "now", [], store.chain_records(), receipts):
            buf.write(text)
        t3 = time.perf_counter()
        buf.seek(0)
        bundle_line = verify_bundle(buf).line()
        t4 = time.perf_counter()
        store.close()
    print(f"built {events} events in {t1 - t0:.1f}s")
    print(f"verify --db: {t2 - t1:.1f}s  ({line})")
    print(f"export --signed: {t3 - t2:.1f}s, {len(buf.getvalue()) / 1e6:.0f} MB")
    print(f"verify BUNDLE: {t4 - t3:.1f}s  ({bundle_line})")


if __name__ == "__main__":
    main()
