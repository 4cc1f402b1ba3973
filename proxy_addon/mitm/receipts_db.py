"""
The receipts store as the options open it: receipts_db, receipts_secret, receipts_lock_timeout
(and, when it opens, receipts_new_db, receipts_lease, receipts_heartbeat).

`ReceiptsDb` holds what the hooks write through and the rest reads from:
- the Installation (crash recovery on open, its lock or lease released on close) and the
  StoreThread that runs its calls off the event loop;
- the Gate bound to that thread (its settings are the addon's to set), and, on SQLite, the
  event loop's own connection on which it answers duplicates without a hand-off (one that
  never waits for the lock or the disk: gate/admission.py, `_decide_here`);
- on PostgreSQL, the Listener that wakes duplicates waiting on another proxy's write;
- a read connection on the event loop's thread (the content view, commands, watch.py);
- the metrics' view of the store: every state change it commits, and the database the
  unknown-outcomes gauge reads.
A password given in receipts_db is taken out of the option (mitmweb's Options show the value
without it) and kept here to connect with. The store is opened again only when one of its
three options changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from mitmproxy import exceptions, optmanager

from proxy_addon.errors import ReceiptsError
from proxy_addon.gate.admission import Gate
from proxy_addon.gate.checkpoint_signer import CheckpointSigner
from proxy_addon.gate.installation import Installation
from proxy_addon.gate.metrics import Metrics
from proxy_addon.gate.store_thread import StoreThread
from proxy_addon.mitm import options
from proxy_addon.store import PostgresStore, Receipt, ReceiptStore, SQLiteStore, open_store
from proxy_addon.store.dsn import without_password
from proxy_addon.store.listener import Listener

logger = logging.getLogger(__name__)


def _log_recovered(recovered: list[tuple[str, str]]) -> None:
    for operation_id, state in recovered:
        logger.warning(f"receipt {operation_id}: left behind by a stopped proxy; now {state}")


class ReceiptsDb:
    """The Installation, store thread, gate, Listener and read connection that receipts_db opens."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        post_reads: Callable[[str], tuple],
        on_change: Callable[[Receipt], None],
    ) -> None:
        self.metrics = metrics
        self.installation: Installation | None = None
        self.calls: StoreThread | None = None
        self.gate: Gate | None = None
        self._post_reads, self._on_change = post_reads, on_change  # the gate's, from the rules in force
        self._config: tuple | None = None
        self._read_store: ReceiptStore | None = None
        self._local: ReceiptStore | None = None  # SQLite: the gate's connection on the event loop
        self._listener: Listener | None = None  # PostgreSQL: LISTEN for receipts other proxies change
        self._signer: CheckpointSigner | None = None  # signs the chain's checkpoints on its own thread
        self._passwords: dict[str, str] = {}  # receipts_db as shown → as given, with its password

    def hide_password(self, opts: optmanager.OptManager) -> bool:
        """
        Take a password out of receipts_db, keeping it here. True when it did: the option was
        updated, which configured again with the value shown, so there is nothing more to do.
        """
        shown, had_password = without_password(opts.receipts_db)
        if had_password:  # mitmweb's Options (and anything that prints options) show it without
            self._passwords[shown] = opts.receipts_db
            opts.update(receipts_db=shown)
        return had_password

    def db(self, opts: optmanager.OptManager) -> str:
        """receipts_db with the password it was given, which the option no longer shows."""
        return self._passwords.get(opts.receipts_db, opts.receipts_db)

    def _lease_expired(self, receipts: list[Receipt]) -> None:
        """
        The heartbeat's (PostgreSQL, on its thread): receipts taken over from proxies whose lease
        expired, each as it is now. Logged; with OpenTelemetry on (the gate's spans), each is a span
        linked to its write's.
        """
        _log_recovered([(r.operation_id, str(r.state)) for r in receipts])
        spans = self.gate.spans if self.gate is not None else None
        if spans is None:
            return
        for r in receipts:
            attributes = {"receipt.api": r.api, "receipt.operation": r.operation, "receipt.state": str(r.state)}
            spans.lease_expired(
                r.operation_id, {**attributes, "receipt.instance": r.instance or ""}, link=r.trace_parent
            )

    def configure(self, opts: optmanager.OptManager) -> None:
        """Open the store again if receipts_db, receipts_secret or receipts_lock_timeout changed."""
        if (self.db(opts), opts.receipts_secret, opts.receipts_lock_timeout) != self._config:
            self._open(opts)

    def _open(self, opts: optmanager.OptManager) -> None:
        try:
            inst = Installation.open(
                self.db(opts),
                secret=opts.receipts_secret or None,
                lock_timeout=opts.receipts_lock_timeout,
                new_db=opts.receipts_new_db,
                lease=opts.receipts_lease,
                heartbeat=opts.receipts_heartbeat,
                on_recovered=self._lease_expired,
            )
        except (ReceiptsError, OSError, ValueError) as e:
            raise exceptions.OptionsError(f"receipts_db: {e}") from None
        old_inst, old_calls = self.installation, self.calls
        if self._read_store is not None:
            self._read_store.close()
            self._read_store = None
        self._close_local()
        inst.store.observer = self.metrics.changed  # every state change it commits (recovery's too)
        self._local = self._open_local(inst)
        self.metrics.watch_db(inst.db, lock_timeout=opts.receipts_lock_timeout)
        self.installation, self.calls = inst, StoreThread(inst.store)
        self.gate = Gate(
            self.calls,
            options.gate_settings(opts),
            post_reads=self._post_reads,
            on_change=self._on_change,
            metrics=self.metrics,
            local=self._local,
        )
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        if isinstance(inst.store, PostgresStore):  # duplicates waiting on another proxy's write are woken at once
            loop, gate = asyncio.get_running_loop(), self.gate
            self._listener = Listener(inst.store.dsn, lambda op: loop.call_soon_threadsafe(gate.wake, op))
            self._listener.start()
            gate.listening = self._listener.connected.is_set
        self._config = (self.db(opts), opts.receipts_secret, opts.receipts_lock_timeout)
        _log_recovered(self.calls.wait(inst.recover))
        self._sign_checkpoints(inst, opts)
        if old_calls is not None:
            old_calls.close(wait=False)
        if old_inst is not None:
            old_inst.release()
        logger.info(f"receipt-proxy: receipts in {inst.store.location} (instance {inst.instance})")

    def _sign_checkpoints(self, inst: Installation, opts: optmanager.OptManager) -> None:
        """Sign checkpoints of the chain with the installation's checkpoint key (gate/checkpoint_signer.py)."""
        if self._signer is not None:
            self._signer.stop()
            self._signer = None
        if inst.signing_key is not None:
            self._signer = CheckpointSigner(
                str(inst.db),
                inst.signing_key,
                every_events=opts.receipts_checkpoint_events,
                every_seconds=opts.receipts_checkpoint_seconds,
                lock_timeout=opts.receipts_lock_timeout,
            )
            self._signer.start()

    def _open_local(self, inst: Installation) -> ReceiptStore | None:
        """
        SQLite (in WAL mode): a connection for the event loop that never waits: no busy timeout
        (a locked database is the store thread's to wait for), no checkpoint at its commits.
        None on PostgreSQL (the fleet's database decides, through the store thread), or when it
        cannot be opened (then the store thread decides everything, as before).
        """
        if not isinstance(inst.store, SQLiteStore) or not inst.store.path:
            return None
        try:
            local = SQLiteStore.open(
                inst.store.path,
                lock_timeout=0,
                clock=inst.store.clock,
                create=False,
                checkpoints=False,
                writes_with=inst.store,
            )
        except ReceiptsError as e:
            logger.warning(f"receipt-proxy: duplicates are decided on the store's thread only: {e}")
            return None
        local.observer = self.metrics.changed
        local.answer_seal = inst.store.answer_seal  # it records outcomes and replays too
        return local

    def _close_local(self) -> None:
        """Close the event loop's connection; the gate that had it decides on the store's thread."""
        if self.gate is not None:
            self.gate.local = None
        if self._local is not None:
            local, self._local = self._local, None
            try:
                local.close()
            except ReceiptsError as e:
                logger.warning(f"receipt-proxy: {e}")

    def reader(self) -> ReceiptStore | None:
        """A connection for reads on the event loop's thread (the content view, commands)."""
        if self._read_store is None and self.installation is not None:
            self._read_store = open_store(self.installation.db, create=False)
        return self._read_store

    # Shutdown, in the addon's `done`: the Listener first, the read connection, then (after the
    # exchanges in flight) the store thread and the Installation.

    def stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.stop()

    def close_reader(self) -> None:
        if self._read_store is not None:
            self._read_store.close()
        self._close_local()

    def close(self) -> None:
        if self.calls is not None:
            self.calls.close(wait=True)
        if self._signer is not None:  # after the last write: its last checkpoint covers every event
            self._signer.stop()
            self._signer = None
        if self.installation is not None:
            self.installation.release()
