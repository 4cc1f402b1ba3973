"""
The floor of this design for a matched write: `scripts/bench --compare-addon bench/write_floor_addon.py
--scenarios write`.

What every matched write must cost, and nothing else: before mitmproxy forwards it, one row
committed with synchronous=FULL (an fsync) on a thread of its own, awaited by the `request`
hook; after the answer, one row updated with synchronous=NORMAL. No rules, no fingerprint, no
duplicate check, no answer of our own, and mitmproxy's own forwarding. What the receipts addon
costs beyond this is ours; what this costs beyond the do-nothing baseline is the design's.

It takes the receipts addon's `receipts_db` and `receipts_rules` options (the bench sets them)
and says "receipt-proxy: ready" like it, so the bench runs it in the compare slot.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from pathlib import Path

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader


class WriteFloor:
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
        self.db.execute("CREATE TABLE IF NOT EXISTS receipts (id INTEGER PRIMARY KEY, intent BLOB, state TEXT)")
        logging.getLogger("bench").info("receipt-proxy: ready (recording, the write floor)")

    def _commit(self, sql: str, args: tuple, synchronous: str) -> int:
        assert self.db is not None
        with self.lock:
            self.db.execute(f"PRAGMA synchronous={synchronous}")
            cur = self.db.execute(sql, args)
            return cur.lastrowid or 0

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.request.method == "POST" and flow.request.path.startswith("/bench/things"):
            sql = "INSERT INTO receipts (intent, state) VALUES (?, 'submitted')"
            flow.metadata["floor"] = await asyncio.to_thread(self._commit, sql, (flow.request.content,), "FULL")

    async def response(self, flow: http.HTTPFlow) -> None:
        if (rowid := flow.metadata.get("floor")) is not None:
            sql = "UPDATE receipts SET state = 'succeeded' WHERE id = ?"
            await asyncio.to_thread(self._commit, sql, (rowid,), "NORMAL")
            if flow.response is not None:  # what the bench checks of a recorded write
                flow.response.headers["X-Receipt-Id"] = str(rowid)
                flow.response.headers["X-Receipt-State"] = "succeeded"


addons = [WriteFloor()]
