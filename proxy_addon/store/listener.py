"""
LISTEN for receipts changed by other processes (PostgreSQL): every event the store writes sends a
NOTIFY on `CHANNEL` with the receipt's id (postgres.py); this thread hears them and calls back, so
a duplicate waiting on another proxy's write is woken at once and mitmweb follows changes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from proxy_addon.store.postgres import CHANNEL


class Listener:
    """
    LISTEN receipt_proxy on a connection and thread of its own: `on_change(receipt id)` for
    every receipt another process (or this one) changed, as each transaction commits. A lost
    connection is opened again (every second until it works); meanwhile the waiters poll.
    """

    def __init__(self, dsn: str, on_change: Callable[[str], object], *, connect_timeout: float = 5.0):
        self.dsn, self.on_change, self.connect_timeout = dsn, on_change, connect_timeout
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.connected = threading.Event()  # set while LISTEN is in effect (for tests)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="receipts-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psycopg  # here: a proxy on SQLite imports this module without needing libpq

        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=max(1, round(self.connect_timeout)),
                    application_name="receipt-proxy listen",
                ) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.connected.set()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            with contextlib.suppress(RuntimeError):  # the event loop has closed: we stop too
                                self.on_change(note.payload)
            except psycopg.Error:
                self.connected.clear()
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
