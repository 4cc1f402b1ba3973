"""
A retry storm through a real proxy logs one line per receipt per window (proxy_addon/mitm/log_limit.py,
tests/mitm/test_log_limit.py), while every duplicate is still answered, recorded in the receipt's
events and counted.
"""

from __future__ import annotations

from tests.e2e.processes import Clients, Proxy
from tests.e2e.proxy.test_integration import events_of, plain, settled
from tests.upstream import Upstream


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
