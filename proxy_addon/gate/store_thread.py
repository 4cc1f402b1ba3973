"""
The receipts store on a thread of its own, for the event loop: `await calls(fn)` runs `fn(store)`
there, one call at a time, in order, with one hand-off each way; `calls.wait(fn)` does the same
from outside the loop. The gate, approvals and the proxy's commands all reach the store this way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from proxy_addon.store import ReceiptStore

T = TypeVar("T")


class StoreThread:
    """
    One store on a thread of its own: calls run there one at a time, in order, and the event
    loop never waits on SQLite. A call is one hand-off each way: a queue's put wakes the thread,
    and the result comes back with one `call_soon_threadsafe` (no executor, no chained futures).
    """

    def __init__(self, store: ReceiptStore):
        self.store = store
        self._queue: queue.SimpleQueue[tuple[Callable[[ReceiptStore], Any], Callable[..., None]] | None] = (
            queue.SimpleQueue()
        )
        self._closed = False
        # Calls submitted (by any thread, under the lock) and run to their end (by the store's thread only): `idle`.
        self._submitted = self._finished = 0
        self._counting = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="receipts-store", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, done = item
            try:
                result = fn(self.store)
            except BaseException as e:  # the caller's to handle, on its side
                self._finished += 1
                done(None, e)
            else:
                self._finished += 1
                done(result, None)

    def _submit(self, fn: Callable[[ReceiptStore], Any], done: Callable[..., None]) -> None:
        if self._closed:
            raise RuntimeError("the receipts store thread is closed")
        with self._counting:
            self._submitted += 1
        self._queue.put((fn, done))

    @property
    def idle(self) -> bool:
        """No call queued or running now: its connection is not writing (a hint; the store still decides)."""
        return self._submitted == self._finished

    async def __call__(self, fn: Callable[[ReceiptStore], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def done(result: Any, error: BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits for it
                loop.call_soon_threadsafe(_settle, future, result, error)

        self._submit(fn, done)
        return await future

    def wait(self, fn: Callable[[ReceiptStore], T], timeout: float | None = None) -> T:
        """Run a call from outside the event loop (or before it runs) and wait for its result."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._submit(fn, lambda result, error: _settle(future, result, error))
        return future.result(timeout=timeout)

    def close(self, *, wait: bool = True) -> None:
        """Close the store on its thread once the calls queued before have run; then the thread ends."""
        if self._closed:
            return
        self._submit(lambda store: store.close(), lambda result, error: None)
        self._closed = True
        self._queue.put(None)
        if wait:
            self._thread.join()


def _settle(
    future: asyncio.Future[Any] | concurrent.futures.Future[Any], result: Any, error: BaseException | None
) -> None:
    """Give a call's result (or its exception) to its future, unless the caller gave up on it (cancelled)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
