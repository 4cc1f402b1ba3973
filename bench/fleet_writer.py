"""
One writer of `scripts/bench --fleet` (bench/fleet_bench.py): a process with its own store, run as a
script so that `proxy_addon` comes from PYTHONPATH (this tree, or an older one's: `--fleet-before`).

    python bench/fleet_writer.py INDEX DESIGN

It reads one JSON command a line on stdin, and answers each with one JSON line on stdout:
{"scenario", "target" (a database URL, or an SQLite path), "storm" (the storm's fingerprint), "hot"
(the mix's shared fingerprints)}. It opens its store (and, on PostgreSQL, its instance lease, as a
proxy of a fleet does) and answers {"ready": true}; the next line says when to begin ({"start":
time.time(), "warmup", "duration"}), the same instant for every writer; it decides attempts
untimed for `warmup` seconds, then timed for `duration`: `begin_attempt` timed, and a forwarded
attempt's outcome recorded (`record_outcome`, with a response: its duplicates are then replayed).
`DESIGN` swaps the PostgreSQL store's locking for a
candidate measured against it (fleet_bench.py: DESIGNS); "as-is" keeps the tree's own.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import uuid


def _store_class(design: str):
    from proxy_addon.store.postgres import PostgresStore

    if design == "as-is":
        return PostgresStore
    from psycopg import errors as pgerrors

    from proxy_addon.store import postgres
    from proxy_addon.store.base import UniqueViolation

    class Candidate(PostgresStore):
        def _begin_sql(self, durable, intents, receipt):
            relax = "" if durable else "SET LOCAL synchronous_commit TO off; "
            if design == "index":  # no lock: the partial unique index alone, UniqueViolation decides again
                return f"BEGIN; {relax}SELECT 1".encode()
            if design == "serializable":  # no lock: SERIALIZABLE, a serialization failure decides again
                return f"BEGIN ISOLATION LEVEL SERIALIZABLE; {relax}SELECT 1".encode()
            if design == "notify-in-tx":
                return super()._begin_sql(durable, intents, receipt)
            if design == "intent-only":  # the per-intent locks without the shared fleet lock
                sql = super()._begin_sql(durable, intents, receipt).decode()
                return sql.replace(f"SELECT pg_advisory_xact_lock_shared({postgres.WRITE_LOCK}); ", "").encode()
            raise SystemExit(f"unknown design {design!r}")

        def _event(self, operation_id, *args, **kw):
            super()._event(operation_id, *args, **kw)
            if design == "notify-in-tx":  # NOTIFY inside the write transaction, as before issue 27
                self._execute("SELECT pg_notify(?, ?)", (postgres.CHANNEL, operation_id))

        def _notify(self):
            if design != "notify-in-tx":
                super()._notify()

        def _failure(self, e):
            failure = super()._failure(e)
            if design == "serializable" and isinstance(e, pgerrors.SerializationFailure) and self._writing:
                return UniqueViolation(str(failure))  # begin_attempt decides again (3 tries)
            return failure

    return Candidate


def main() -> int:
    index, design = int(sys.argv[1]), sys.argv[2]
    from proxy_addon.errors import StoreUnavailable
    from proxy_addon.states import State
    from proxy_addon.store import Attempt, RecordedResponse, Store
    from proxy_addon.store.sealing import AnswerSeal

    response = RecordedResponse(201, [("Content-Type", "application/json")], b'{"id": 1}')
    instance = f"bench-{index}-{os.getpid()}"

    def attempt(fingerprint: str) -> Attempt:
        return Attempt(
            api="bench",
            operation="things.create",
            method="POST",
            target="http://127.0.0.1/bench/things",
            intent_fingerprint=fingerprint,
            intent={"body": {"title": fingerprint}, "path": {}},
            principal="anonymous",
            flow_id="bench",
            instance=instance,
        )

    rng = random.Random(index)
    print(json.dumps({"loaded": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        target = cmd["target"]
        if target.startswith("postgresql"):
            store = _store_class(design).open(target, create=False)
            store.claim_lease(instance, "bench", os.getpid(), 600)
        else:
            store = Store.open(target)
        store.answer_seal = AnswerSeal(b"bench-key-" * 7)
        print(json.dumps({"ready": True}), flush=True)
        go = json.loads(sys.stdin.readline())  # {"start", "warmup", "duration"}: the same instant for every writer
        kinds: dict[str, int] = {}
        ms: list[float] = []
        failures = 0
        while time.time() < go["start"]:
            time.sleep(0.002)
        timed_from = go["start"] + go["warmup"]
        end = timed_from + go["duration"]
        cpu0, timed, forwarded = time.process_time(), False, 0  # forwarded: warm-up included (a storm's winner)
        while time.time() < end:
            if not timed and time.time() >= timed_from:
                kinds, ms, failures, cpu0, timed = {}, [], 0, time.process_time(), True
            if cmd["scenario"] == "storm":
                fingerprint = cmd["storm"]
            elif cmd["scenario"] == "mix" and rng.random() < 0.25:
                fingerprint = rng.choice(cmd["hot"])
            else:
                fingerprint = "sha256:" + uuid.uuid4().hex
            t0 = time.perf_counter()
            try:
                d = store.begin_attempt(attempt(fingerprint))
            except StoreUnavailable:
                failures += 1  # counted, not a decision (a candidate design's give-up, or a lock_timeout)
                continue
            ms.append((time.perf_counter() - t0) * 1000)
            kinds[d.kind] = kinds.get(d.kind, 0) + 1
            if d.kind == "forward":
                forwarded += 1
                try:
                    store.record_outcome(
                        d.receipt.operation_id,
                        State.SUCCEEDED,
                        reason="bench",
                        http_status=201,
                        external_id="1",
                        response=response,
                    )
                except StoreUnavailable:
                    failures += 1  # a candidate design's serialization failure: the receipt stays submitted
        cpu = time.process_time() - cpu0
        store.close()
        print(
            json.dumps({"kinds": kinds, "ms": ms, "failures": failures, "cpu": cpu, "forwarded": forwarded}), flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
