"""
The receipts store alone: what a matched request costs in SQLite, with 0, 100k and 1M
receipts already in the database.

Each database is filled fast with one INSERT ... SELECT over a recursive CTE (inside one
transaction, journal off), with rows shaped like the proxy's own (`Store.open` creates the
schema first, so the fill matches it). Then the proxy's calls are timed on every database
in rotating order, call by call:

- insert:     `begin_attempt` of a new fingerprint → a `submitted` receipt and its event, committed (fsync);
- outcome:    `record_outcome` of that receipt: `succeeded` with a recorded response (synchronous=NORMAL, no fsync);
- dup-check:  `begin_attempt(record_duplicate=False)` of an unresolved fingerprint: the peek the addon makes first;
- dup-record: `begin_attempt` of the same: the blocked answer with its audit event (synchronous=NORMAL, no fsync);
- replay-check: `begin_attempt(record_duplicate=False)` of a succeeded fingerprint with a recorded response.
"""

from __future__ import annotations

import gc
import hashlib
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from bench.http_bench import Stats
from proxy_addon.states import State
from proxy_addon.store import Attempt, RecordedResponse, Store
from proxy_addon.store.sealing import AnswerSeal

OPS = ("insert", "outcome", "dup-check", "dup-record", "replay-check")

_FILL = """
WITH RECURSIVE c(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM c WHERE i + 1 < ?)
INSERT INTO receipts (operation_id, api, operation, method, target, state, intent_fingerprint, intent, principal,
    submitted_at, updated_at, completed_at, http_status, external_id, error, instance,
    response_status, response_headers, response_body, response_truncated)
SELECT strftime('%Y%m%dT%H%M%SZ', 1735689600 + i, 'unixepoch') || '-' || printf('%010x', i),
    'bench', 'things.create', 'POST', 'http://127.0.0.1/bench/things',
    CASE WHEN i % 1000 = 999 THEN 'outcome_unknown' ELSE 'succeeded' END,
    'sha256:' || lower(hex(randomblob(32))),
    '{"body": {"title": "fill ' || i || '"}, "path": {}}', 'anonymous',
    strftime('%Y-%m-%dT%H:%M:%S.000000Z', 1735689600 + i, 'unixepoch'),
    strftime('%Y-%m-%dT%H:%M:%S.000000Z', 1735689600 + i, 'unixepoch'),
    strftime('%Y-%m-%dT%H:%M:%S.000000Z', 1735689600 + i, 'unixepoch'),
    CASE WHEN i % 1000 = 999 THEN NULL ELSE 201 END,
    CASE WHEN i % 1000 = 999 THEN NULL ELSE CAST(i AS TEXT) END,
    CASE WHEN i % 1000 = 999 THEN 'outcome unknown: RemoteProtocolError' ELSE NULL END,
    'fill',
    CASE WHEN i % 1000 = 999 THEN NULL ELSE 201 END,
    CASE WHEN i % 1000 = 999 THEN NULL ELSE '[["Content-Type", "application/json"]]' END,
    CASE WHEN i % 1000 = 999 THEN NULL ELSE CAST('{"id": ' || i || '}' AS BLOB) END,
    CASE WHEN i % 1000 = 999 THEN NULL ELSE 0 END
FROM c
"""


def fill(path: Path, n: int) -> float:
    """Add `n` receipts (999 in 1000 succeeded, 1 outcome_unknown), each with its two events. Returns seconds."""
    t0 = time.perf_counter()
    Store.open(path).close()  # the schema, as the proxy creates it
    if n:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=OFF")  # Store.open switches it back to WAL
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute("PRAGMA cache_size=-524288")
            conn.execute("BEGIN")
            conn.execute(_FILL, (0, n))
            conn.execute(
                "INSERT INTO receipt_events (operation_id, at, event, from_state, to_state, reason, actor, flow_id) "
                "SELECT operation_id, submitted_at, 'transition', NULL, 'submitted', 'new attempt', 'proxy', NULL "
                "FROM receipts ORDER BY rowid"
            )
            conn.execute(
                "INSERT INTO receipt_events (operation_id, at, event, from_state, to_state, reason, actor, flow_id) "
                "SELECT operation_id, updated_at, 'transition', 'submitted', state, "
                "CASE state WHEN 'succeeded' THEN 'upstream answered HTTP 201' ELSE 'outcome unknown' END, 'proxy', "
                "NULL "
                "FROM receipts ORDER BY rowid"
            )
            conn.execute("COMMIT")
        finally:
            conn.close()
    return time.perf_counter() - t0


def attempt(tag: str) -> Attempt:
    return Attempt(
        api="bench",
        operation="things.create",
        method="POST",
        target="http://127.0.0.1/bench/things",
        intent_fingerprint="sha256:" + hashlib.sha256(tag.encode()).hexdigest(),
        intent={"body": {"title": tag}, "path": {}},
        principal="anonymous",
        flow_id="bench",
        instance="bench",
    )


RESPONSE = RecordedResponse(201, [("Content-Type", "application/json")], b'{"id": 1}')


def run(workdir: Path, sizes: tuple[int, ...], n: int, warmup: int, log: Callable[[str], None]) -> dict:
    stores: dict[int, Store] = {}
    fills: dict[int, float] = {}
    try:
        for size in sizes:
            path = workdir / f"store-{size}.db"
            fills[size] = fill(path, size)
            stores[size] = Store.open(path)
            stores[size].answer_seal = AnswerSeal(b"bench-key-" * 7)  # answers sealed, as the proxy's are
            log(f"  store: {size:>9,} receipts filled in {fills[size]:.1f}s ({path.stat().st_size / 1e6:,.0f} MB)")
        # A receipt left outcome_unknown (duplicates are blocked) and one succeeded with a response (replayed).
        for size, s in stores.items():
            d = s.begin_attempt(attempt(f"unknown-{size}"))
            s.transition(d.receipt.operation_id, State.OUTCOME_UNKNOWN, reason="bench", error="bench")
            d = s.begin_attempt(attempt(f"done-{size}"))
            s.transition(d.receipt.operation_id, State.SUCCEEDED, reason="bench", http_status=201, response=RESPONSE)
        ms: dict[int, dict[str, list[float]]] = {size: {op: [] for op in OPS} for size in sizes}
        order = list(sizes)
        gc.collect()
        gc.disable()
        try:
            for i in range(warmup + n):
                k = i % len(order)
                for size in order[k:] + order[:k]:
                    s, out = stores[size], ms[size]
                    t = []
                    t.append(time.perf_counter())
                    d = s.begin_attempt(attempt(f"new-{size}-{i}"))
                    t.append(time.perf_counter())
                    s.record_outcome(
                        d.receipt.operation_id,
                        State.SUCCEEDED,
                        reason="bench",
                        http_status=201,
                        external_id=str(i),
                        response=RESPONSE,
                    )
                    t.append(time.perf_counter())
                    blocked = s.begin_attempt(attempt(f"unknown-{size}"), record_duplicate=False)
                    t.append(time.perf_counter())
                    s.begin_attempt(attempt(f"unknown-{size}"))
                    t.append(time.perf_counter())
                    replay = s.begin_attempt(attempt(f"done-{size}"), record_duplicate=False)
                    t.append(time.perf_counter())
                    if (d.kind, blocked.kind, replay.kind) != ("forward", "blocked", "replay"):
                        raise AssertionError(f"store {size}: decisions {d.kind} {blocked.kind} {replay.kind}")
                    if i >= warmup:
                        for j, op in enumerate(OPS):
                            out[op].append((t[j + 1] - t[j]) * 1000)
        finally:
            gc.enable()
    finally:
        for s in stores.values():
            s.close()
    return {
        "fill_seconds": fills,
        "ops": {size: {op: Stats.of(v) for op, v in per.items()} for size, per in ms.items()},
    }
