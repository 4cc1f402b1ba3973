"""
The gate's decisions on the event loop's own SQLite connection (`local`), without a hand-off.

    here = OnTheLoop(calls, local)
    decision = here.decide(attempt, after_success=..., replay_window=..., record_duplicate=...)
    receipt = here.record(operation_id, outcome, flow_id)     # None: the store's thread records it

`local` is a connection of the event loop's own in WAL mode that never waits: no busy timeout,
no checkpoint at its commits (mitm/receipts_db.py opens it, and sets it to None when it closes;
PostgreSQL has none: the fleet's database decides, through the store's thread, as it does
everything here when `local` is None).
- A duplicate is answered from one read, with its answer recorded in the same transaction
  (`synchronous=NORMAL`; store/attempts.py, `answer_duplicate`). "new" (a receipt to insert,
  durably) and "busy" (another writer, a failure) are the store thread's to decide. An intent
  not seen lately is first looked up with one read outside any transaction (a new write then
  opens none); one seen lately (a retry) goes straight to the transaction. Which way it goes
  is a guess (RECENT intents remembered): the store's transaction decides either way.
- An outcome is recorded here only while the store's thread is idle: under load the hand-off
  wins (SQLite runs there without the GIL, beside the event loop).
- Every LOCAL_CHECKPOINT commits here, a checkpoint of the WAL runs on the store's thread, not
  waited for: without it, a stream of duplicates only would grow the WAL without bound.
Nothing here imports mitmproxy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Literal

from proxy_addon.errors import StoreError
from proxy_addon.gate.store_thread import StoreThread
from proxy_addon.outcome.classify import Outcome
from proxy_addon.store import Attempt, Decision, Receipt, ReceiptStore

__all__ = ["LOCAL_CHECKPOINT", "OnTheLoop"]

logger = logging.getLogger("proxy_addon.gate.admission")

LOCAL_CHECKPOINT = 256  # commits on the event loop's connection between two checkpoints of the WAL
RECENT = 4096  # intent fingerprints remembered as seen lately (a retry skips the lookup before its transaction)


class OnTheLoop:
    def __init__(self, calls: StoreThread, local: ReceiptStore | None):
        self.calls = calls
        self.local = local
        self._commits = 0  # since the last checkpoint: `local` never checkpoints at its commits
        self._checkpoint: asyncio.Task[None] | None = None
        self._recent: dict[str, None] = {}  # fingerprints decided here lately, oldest first

    def decide(
        self,
        attempt: Attempt,
        *,
        after_success: str,
        replay_window: float,
        record_duplicate: bool | Callable[[Decision], bool],
    ) -> Decision | Literal["new", "busy"]:
        """A duplicate's answer, decided and recorded here; else "new" or "busy" for the store's thread."""
        local = self.local
        if local is None:
            return "busy"
        fingerprint = attempt.intent_fingerprint
        seen = fingerprint in self._recent
        if not seen:
            self._recent[fingerprint] = None
            if len(self._recent) > RECENT:
                del self._recent[next(iter(self._recent))]
        try:
            decision = local.answer_duplicate(
                attempt,
                after_success=after_success,
                replay_window=replay_window,
                record_duplicate=record_duplicate,
                look_first=not seen,
            )
        except StoreError as e:  # the store's thread decides, and reports what fails there too
            logger.debug("receipts: the event loop's connection could not decide (%s); the store's thread decides", e)
            return "busy"
        if isinstance(decision, Decision):
            self._checkpoint_later()
        return decision

    def record(self, operation_id: str, outcome: Outcome, flow_id: str | None) -> Receipt | None:
        """
        The outcome's transition here, when the store's thread is idle; None when it has calls to
        run or this did not record it (another writer, a receipt that moved on, a failure):
        nothing was written, and the store's thread does.
        """
        local = self.local
        if local is None or not self.calls.idle:
            return None
        try:
            receipt = local.record_outcome(
                operation_id,
                outcome.state,
                reason=outcome.reason,
                flow_id=flow_id,
                without_waiting=True,
                **outcome.fields(),
            )
        except StoreError as e:
            logger.debug("receipt %s: the event loop's connection did not record the outcome (%s)", operation_id, e)
            return None
        self._checkpoint_later()
        return receipt

    def _checkpoint_later(self) -> None:
        self._commits += 1
        if self._commits < LOCAL_CHECKPOINT or (self._checkpoint is not None and not self._checkpoint.done()):
            return
        self._commits = 0

        async def checkpoint() -> None:
            try:
                await self.calls(lambda s: s.checkpoint())
            except (StoreError, RuntimeError) as e:  # RuntimeError: the store's thread has closed
                logger.warning(f"receipts: could not checkpoint the database's log: {e}")

        self._checkpoint = asyncio.get_running_loop().create_task(checkpoint())
