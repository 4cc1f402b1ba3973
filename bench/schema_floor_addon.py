"""
The floor of a matched write with the receipts schema:
`scripts/bench --compare-addon bench/schema_floor_addon.py --scenarios write --concurrency 0`.

bench/floor_addon.py commits one row of a one-index table. The proxy's store commits the
receipt's row into its own schema (store/migrations.py: the receipt's indexes, the partial
unique index that keeps one unresolved receipt per intent, the append-only events and theirs),
and an event with each state change. This script runs those statements, and nothing else, for
each matched write, so the distance from the floor to it is what the schema costs and the
distance from it to the addon is the rest of the addon (its Python included):

- before mitmproxy forwards, on a thread, with synchronous=FULL: BEGIN IMMEDIATE, the read of
  the intent's latest receipt, the receipt's INSERT and its first event, COMMIT;
- after the answer, on a thread, with synchronous=NORMAL: BEGIN IMMEDIATE, the UPDATE that
  records the answer (state, status, headers, body, external id), its event, COMMIT.

The database is created by the store itself (`SQLiteStore.open`); the statements use the
store's own column list and event INSERT. No rules, no fingerprint of a view (a SHA-256 of
the body and the flow's id: every request is a new write), no store layer in Python, no log
line, no metrics; writes only (POSTs to /bench/things).

`--compare-set schema_floor_store=true`: the same two transactions through the store's own
methods instead (`begin_attempt(durable=True)`, `record_outcome`), on the same thread and
connection: what the store's Python layer adds to its SQL (its checks, `Receipt`s, events,
observer).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from proxy_addon.states import State
from proxy_addon.store import Attempt, RecordedResponse, SQLiteStore
from proxy_addon.store.attempts import _RECEIPT_COLUMNS
from proxy_addon.store.base import marks
from proxy_addon.store.records import iso, new_operation_id, utcnow
from proxy_addon.store.sealing import AnswerSeal

PATH = "/bench/things"
_INSERT = f"INSERT INTO receipts ({', '.join(_RECEIPT_COLUMNS)}) VALUES ({marks(len(_RECEIPT_COLUMNS))})"
# The event's INSERT without its chain (store/hash_chain.py adds a read of the chain's tip and a SHA-256):
# the floor of the schema, not of the chain.
_EVENT_INSERT = (
    "INSERT INTO receipt_events (operation_id, at, event, from_state, to_state, reason, actor, flow_id) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_LATEST = "SELECT state FROM receipts WHERE intent_fingerprint = ? ORDER BY rowid DESC LIMIT 1"
_ANSWER = (
    "UPDATE receipts SET http_status = ?, response_status = ?, response_headers = ?, response_body = ?, "
    "response_truncated = 0, external_id = ?, state = 'succeeded', updated_at = ?, completed_at = ? "
    "WHERE operation_id = ? AND state IN ('submitted')"
)


class SchemaFloor:
    def __init__(self) -> None:
        self.db: sqlite3.Connection | None = None
        self.store: SQLiteStore | None = None  # schema_floor_store: the store's methods instead of its statements
        self.lock = threading.Lock()

    def load(self, loader: Loader) -> None:
        loader.add_option("receipts_db", str, "", "the receipts database (created by the store)")
        loader.add_option("receipts_rules", str, "", "ignored: every POST to /bench/things is a write")
        loader.add_option("schema_floor_store", bool, False, "the two transactions through the store's methods")

    def running(self) -> None:
        path = Path(ctx.options.receipts_db)
        path.parent.mkdir(parents=True, exist_ok=True)
        store = SQLiteStore.open(path)  # the schema, migrated, in WAL mode
        if ctx.options.schema_floor_store:
            store.answer_seal = AnswerSeal(b"bench-key-" * 7)  # answers sealed, as the proxy's are
            self.store = store
            logging.getLogger("bench").info("receipt-proxy: ready (recording, the floor through the store)")
            return
        store.close()
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA foreign_keys=ON")
        logging.getLogger("bench").info("receipt-proxy: ready (recording, the floor with the receipts schema)")

    def _locked(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return call(*args, **kwargs)

    def _transaction(self, synchronous: str, statements: list[tuple[str, tuple]]) -> None:
        assert self.db is not None
        with self.lock:
            self.db.execute(f"PRAGMA synchronous={synchronous}")
            self.db.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in statements:
                    self.db.execute(sql, args).fetchall()
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    async def request(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        if req.method != "POST" or req.path.split("?")[0] != PATH:
            return
        # One receipt a request, whatever its body (the bench's warm-up repeats bodies): the floor of a new write.
        fingerprint = "sha256:" + hashlib.sha256((req.content or b"") + flow.id.encode()).hexdigest()
        if self.store is not None:
            attempt = Attempt("bench", "things.create", "POST", req.pretty_url, fingerprint, {}, "anonymous", flow.id)
            decision = await asyncio.to_thread(self._locked, self.store.begin_attempt, attempt, durable=True)
            flow.metadata["schema_floor"] = decision.receipt.operation_id
            return
        now = utcnow()
        at, operation_id = iso(now), new_operation_id(now)  # as the store makes them
        row: tuple[object, ...] = (
            operation_id,
            "bench",
            "things.create",
            "POST",
            req.pretty_url,
            "submitted",
            fingerprint,
        )
        row += (json.dumps({"body": {}, "path": {}}), "anonymous", at, at, flow.id) + (None,) * 6
        first = (operation_id, at, "transition", None, "submitted", "new attempt", "proxy", flow.id)
        await asyncio.to_thread(
            self._transaction, "FULL", [(_LATEST, (fingerprint,)), (_INSERT, row), (_EVENT_INSERT, first)]
        )
        flow.metadata["schema_floor"] = operation_id

    async def response(self, flow: http.HTTPFlow) -> None:
        operation_id, resp = flow.metadata.get("schema_floor"), flow.response
        if operation_id is None or resp is None:
            return
        if self.store is not None:
            recorded = RecordedResponse(resp.status_code, list(resp.headers.items()), resp.content or b"")
            await asyncio.to_thread(
                self._locked,
                self.store.record_outcome,
                operation_id,
                State.SUCCEEDED,
                reason="upstream answered",
                flow_id=flow.id,
                http_status=resp.status_code,
                response=recorded,
                external_id="1",
            )
        else:
            at, headers = iso(utcnow()), json.dumps([[k, v] for k, v in resp.headers.items()])
            answer = (resp.status_code, resp.status_code, headers, resp.content, "1", at, at, operation_id)
            event = (operation_id, at, "transition", "submitted", "succeeded", "upstream answered", "proxy", flow.id)
            await asyncio.to_thread(self._transaction, "NORMAL", [(_ANSWER, answer), (_EVENT_INSERT, event)])
        resp.headers["X-Receipt-Id"] = operation_id
        resp.headers["X-Receipt-State"] = "succeeded"


addons = [SchemaFloor()]
