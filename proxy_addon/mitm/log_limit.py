"""
At most one log line per key in a window: the lines a retry storm would repeat.

    lines = LogLimit(window=10.0)
    lines.log(logger, logging.WARNING, receipt.operation_id, f"receipt {id}: duplicate blocked")

An agent that retries one write in a loop gets each duplicate blocked or replayed, and each is
recorded in the receipt's events, counted in the metrics and marked in mitmweb. The log says the
first at once, then at most one line per receipt every `window` seconds, with how many it held
back since the line before. A line costs mitmproxy's log handlers more than the duplicate's own
answer (docs/benchmarks.md). At most `keys` keys are remembered; the oldest is forgotten first
(its next duplicate logs again).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

__all__ = ["LogLimit"]


class LogLimit:
    def __init__(self, window: float = 10.0, keys: int = 1024, clock: Callable[[], float] = time.monotonic):
        self.window = window
        self.keys = keys
        self.clock = clock
        self._last: collections.OrderedDict[str, tuple[float, int]] = (
            collections.OrderedDict()
        )  # key → (logged at, held)

    def allow(self, key: str) -> int | None:
        """None: hold this line back (counted); else log it, saying how many were held back since the last."""
        now = self.clock()
        seen = self._last.get(key)
        if seen is not None and now - seen[0] < self.window:
            self._last[key] = (seen[0], seen[1] + 1)
            return None
        self._last[key] = (now, 0)
        self._last.move_to_end(key)
        while len(self._last) > self.keys:
            self._last.popitem(last=False)
        return seen[1] if seen is not None else 0

    def log(self, logger: logging.Logger, level: int, key: str, message: str) -> None:
        """`message` at `level`, unless held back (`allow`); it then says how many it held back."""
        if (held := self.allow(key)) is not None:
            logger.log(level, message + self.more(held))

    @staticmethod
    def more(held: int) -> str:
        """The end of a line that held others back: `; 3 more like it not logged since the last line`."""
        return f"; {held} more like it not logged since the last line" if held else ""
