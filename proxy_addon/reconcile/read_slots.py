"""
The bound on reconcile reads at once in one process (`reads_max`, the option receipts_reads_max, 8).

    slots = ReadSlots(lambda: settings.reads_max)
    async with slots.hold(receipt, timeout=settings.reads.timeout):   # NoReadSlot if none comes free
        ...read...

Every reconcile read of this process (a duplicate's, an answer's evidence, an operator's) takes a
slot first, and the others wait their turn, first come first served. Only reads wait; no other
request does, nor a reconcile of an operation with no read configured (decided by its
idempotency key, or manual_review).
- The slot is taken before the claim and given back as soon as the read is judged, before the
  verdict is recorded (reconcile/settle.py). While a read waits, its receipt stays `outcome_unknown`
  (another process or the CLI may settle it meanwhile: this read's claim then fails, and the
  duplicate is answered from what they recorded); it is `reconciling` only while its read runs.
- A read waits for a slot at most `reads.timeout` (receipts_read_timeout), then gives up: nothing
  is claimed, read or recorded, the receipt stays as it was (no failed read is counted: the API
  was not asked), and its duplicates get the 409 of an `outcome_unknown` receipt. The wait does
  not count against the read's own timeout: a read that got its slot always has all of
  `reads.timeout`, so waiting never turns into a failed read. A duplicate (and every duplicate
  that shares its read) so waits at most twice `reads.timeout` for a read.
- A change of `reads_max` applies to reads asked for after it; the ones already running or
  waiting keep the bound they started under. The bound is per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from proxy_addon.store import Receipt

__all__ = ["NoReadSlot", "ReadSlots"]

logger = logging.getLogger(__name__)


class NoReadSlot(Exception):
    """No read slot came free within the read timeout: nothing was claimed or read."""


class ReadSlots:
    def __init__(self, reads_max: Callable[[], int]):
        self.reads_max = reads_max  # read at each hold: a changed option applies to the reads after it
        self._slots: asyncio.Semaphore | None = None
        self._bound = 0

    def _current(self) -> asyncio.Semaphore:
        """The semaphore of `reads_max` slots; a new one when `reads_max` changed (the reads already
        holding or waiting for the old one keep it)."""
        if self._slots is None or self._bound != self.reads_max():
            self._bound = self.reads_max()
            self._slots = asyncio.Semaphore(self._bound)
        return self._slots

    @contextlib.asynccontextmanager
    async def hold(self, receipt: Receipt, timeout: float) -> AsyncIterator[None]:
        """Hold one of the `reads_max` slots; NoReadSlot when none comes free within `timeout` seconds."""
        slots, bound = self._current(), self._bound
        if slots.locked():
            logger.info(
                "receipt %s: all %d read slots are taken (receipts_reads_max); its read waits for one to end",
                receipt.operation_id,
                bound,
            )
        try:
            async with asyncio.timeout(timeout):
                await slots.acquire()
        except TimeoutError:
            raise NoReadSlot(
                f"no read slot came free within {timeout:g}s (receipts_read_timeout): other reconcile reads "
                f"held all {bound} (receipts_reads_max)"
            ) from None
        try:
            yield
        finally:
            slots.release()
