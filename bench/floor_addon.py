"""
The floor of this design, for a matched write and for a duplicate:
`scripts/bench --compare-addon bench/floor_addon.py --scenarios write,blocked,replayed`.

What every matched write must cost, and nothing else: before mitmproxy forwards it, one row
committed with synchronous=FULL (an fsync) on a thread of its own, awaited by the `request`
hook; after the answer, the row updated with the answer (status and body, to replay it) with
synchronous=NORMAL. No rules, no fingerprint of a view, no answer of our own, and mitmproxy's
own forwarding.

What every duplicate must cost, and nothing else: a hash of the body, one indexed read of its
receipt and one event row committed with synchronous=NORMAL, both on the event loop (no
hand-off), then the answer: the recorded one for a succeeded receipt, a constant 409 for any
other. No rules, no log line, no metrics.

What the receipts addon costs beyond this is ours; what this costs beyond the do-nothing
baseline (and, for duplicates, beyond bench/constant_addon.py) is the design's.

It takes the receipts addon's `receipts_db` and `receipts_rules` options (the bench sets them),
says "receipt-proxy: ready" like it, and answers the X-Receipt-* headers the bench checks, so
the bench runs it in the compare slot. One shortcut, outside the timed requests: the blocked
scenario's first attempt (`?fault=drop`, which the upstream drops) is recorded as
outcome_unknown and answered 502 here, without being sent, since mitmproxy's own 502 for a
dropped connection cannot carry the header the bench checks.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sqlite3
import threading
from pathlib import Path

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

PATH = "/bench/things"
SCHEMA = """
CREATE TABLE IF NOT EXISTS receipts (
    id INTEGER PRIMARY KEY, fingerprint BLOB NOT NULL UNIQUE, state TEXT NOT NULL, status INTEGER, body BLOB);
CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, receipt_id INTEGER NOT NULL, kind TEXT NOT NULL);
"""


class Floor:
    def __init__(self) -> None:
        self.db: sqlite3.Connection | None = None
        self.lock = threading.Lock()

    def load(self, loader: Loader) -> None:
        loader.add_option("receipts_db", str, "", "the floor's SQLite file")
        loader.add_option("receipts_rules", str, "", "ignored: every POST to /bench/things is a write")

    def running(self) -> None:
        Path(ctx.options.receipts_db).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(ctx.options.receipts_db, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)
        logging.getLogger("bench").info("receipt-proxy: ready (recording, the design's floor)")

    def _commit(self, sql: str, args: tuple, synchronous: str) -> int:
        assert self.db is not None
        with self.lock:
            self.db.execute(f"PRAGMA synchronous={synchronous}")
            return self.db.execute(sql, args).lastrowid or 0

    def _duplicate(self, fingerprint: bytes) -> tuple | None:
        """The receipt of this fingerprint, with the duplicate's event committed (NORMAL), or None."""
        assert self.db is not None
        with self.lock:
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("BEGIN IMMEDIATE")
            try:
                row = self.db.execute(
                    "SELECT id, state, status, body FROM receipts WHERE fingerprint = ?", (fingerprint,)
                ).fetchone()
                if row is not None:
                    self.db.execute("INSERT INTO events (receipt_id, kind) VALUES (?, 'duplicate')", (row[0],))
            finally:
                self.db.execute("COMMIT")
        return row

    async def request(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        if req.method != "POST" or req.path.split("?")[0] != PATH:
            return
        fingerprint = hashlib.sha256(req.content or b"").digest()
        if (row := self._duplicate(fingerprint)) is not None:
            rowid, state, status, body = row
            if state == "succeeded":
                flow.response = http.Response.make(
                    status,
                    body,
                    {
                        "Content-Type": "application/json",
                        "X-Receipt-Id": str(rowid),
                        "X-Receipt-State": "succeeded",
                        "X-Receipt-Replayed": "true",
                    },
                )
            else:
                flow.response = http.Response.make(
                    409,
                    b'{"error": "duplicate"}',
                    {"Content-Type": "application/json", "X-Receipt-Id": str(rowid), "X-Receipt-State": state},
                )
            return
        sql = "INSERT INTO receipts (fingerprint, state) VALUES (?, ?)"
        if "fault=drop" in req.path:  # the blocked scenario's untimed setup (see above)
            rowid = await asyncio.to_thread(self._commit, sql, (fingerprint, "outcome_unknown"), "FULL")
            flow.response = http.Response.make(
                502, b"", {"X-Receipt-Id": str(rowid), "X-Receipt-State": "outcome_unknown"}
            )
            return
        flow.metadata["floor"] = await asyncio.to_thread(self._commit, sql, (fingerprint, "submitted"), "FULL")

    async def response(self, flow: http.HTTPFlow) -> None:
        if (rowid := flow.metadata.get("floor")) is not None and flow.response is not None:
            sql = "UPDATE receipts SET state = 'succeeded', status = ?, body = ? WHERE id = ?"
            await asyncio.to_thread(
                self._commit, sql, (flow.response.status_code, flow.response.content, rowid), "NORMAL"
            )
            flow.response.headers["X-Receipt-Id"] = str(rowid)
            flow.response.headers["X-Receipt-State"] = "succeeded"


addons = [Floor()]
