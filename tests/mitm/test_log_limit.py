"""
At most one log line per key in a window (proxy_addon/mitm/log_limit.py), the next one counting the lines
held back, in bounded memory. A retry storm through a real proxy: tests/e2e/proxy/test_log_limit.py.
"""

from __future__ import annotations

from proxy_addon.mitm.log_limit import LogLimit


def test_one_line_per_key_per_window_and_the_next_counts_the_held_back() -> None:
    now = [100.0]
    lines = LogLimit(window=10.0, keys=2, clock=lambda: now[0])
    assert lines.allow("a") == 0  # the first: at once
    assert [lines.allow("a") for _ in range(3)] == [None, None, None]
    assert lines.allow("b") == 0  # another key has its own window
    now[0] += 10.0
    assert lines.allow("a") == 3  # the window passed: a line, saying what was held back
    assert lines.allow("a") is None
    assert LogLimit.more(3) == "; 3 more like it not logged since the last line"
    assert LogLimit.more(0) == ""


def test_memory_is_bounded_and_the_oldest_key_is_forgotten_first() -> None:
    lines = LogLimit(window=10.0, keys=2, clock=lambda: 0.0)
    for key in ("a", "b", "c"):
        assert lines.allow(key) == 0
    assert len(lines._last) == 2
    assert lines.allow("a") == 0  # forgotten: logs again
    assert lines.allow("c") is None  # still remembered
