"""
A retry storm logs one line per receipt per window (proxy_addon/mitm/log_limit.py), while every
duplicate is still answered, recorded in the receipt's events and counted.
"""

from __future__ import annotations

from proxy_addon.mitm.log_limit import LogLimit
from tests.conftest import Clients, Proxy
from tests.test_integration import events_of, plain, settled
from tests.upstream import Upstream


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


def test_a_retry_storm_logs_one_blocked_line_per_receipt(clients: Clients, proxy: Proxy, upstream: Upstream, bucket):
    url = plain(upstream, bucket)
    upstream.plan(f"/api/{bucket}/plain", "drop")
    assert clients.send("httpx", "POST", url, {"title": "storm"}).status == 502
    (r,) = settled(proxy, bucket)
    assert [clients.send("httpx", "POST", url, {"title": "storm"}).status for _ in range(8)] == [409] * 8
    assert [e[0] for e in events_of(proxy, r.operation_id)] == ["transition", "transition"] + ["blocked"] * 8
    lines = [line for line in proxy.log().splitlines() if f"receipt {r.operation_id}: duplicate blocked" in line]
    assert len(lines) == 1, lines
    assert lines[0].endswith("duplicate blocked (outcome_unknown)")
    assert upstream.commits(f"/api/{bucket}/plain") == 1
