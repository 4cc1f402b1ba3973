"""
The rest of an answer the exchange reads itself (mitm/exchange.py `Reply.read_rest`), against the real
upstream of tests/upstream.py: how each way of ending is told (complete, past the limit, past the
deadline, broken, the agent gone), and the connection closed. Bounded memory through a real proxy:
tests/e2e/proxy/test_memory.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from mitmproxy import http

from proxy_addon.mitm import exchange
from proxy_addon.mitm.exchange import make_client
from proxy_addon.wire.upstream import Upstream as UpstreamConfig
from tests.conftest import wait_for
from tests.upstream import Upstream

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    """An upstream of this module's own: bodies hashed, not kept (a 200 MB write would stay in memory)."""
    with Upstream(keep_bodies=False, endless_seconds=30) as upstream:
        yield upstream


def bucket() -> str:
    return f"m{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize("case", ["complete", "too_large", "agent_left", "timeout", "broken"])
async def test_reading_the_rest_of_an_answer_ends_at_each_bound(case, up):
    """exchange.Reply.read_rest against the real upstream: how each way of ending is told, and the connection closed."""
    path = f"/api/{bucket()}/things"
    up.plan(path, "large" if case == "complete" else "endless")
    up.endless_rate = {"timeout": 4 * MiB, "broken": 4 * MiB}.get(case)
    up.endless_seconds = 1 if case == "broken" else 30  # then it stops mid-body, without the last chunk
    headers: dict[str | bytes, str | bytes] = {"Content-Type": "application/json"}
    req = http.Request.make("POST", f"{up.url}{path}", b'{"title": "rest"}', headers)
    try:
        async with make_client(UpstreamConfig()) as client:
            reply = await exchange.send(client, req, deadline=2 if case == "timeout" else 10, cap=MiB)
            assert isinstance(reply, exchange.Reply) and not reply.complete, reply
            assert reply.response.status_code == (201 if case == "complete" else 200)
            rest = await reply.read_rest(limit=16 * MiB, wanted=lambda: case != "agent_left")
    finally:
        up.endless_rate, up.endless_seconds = None, 30
    assert rest.why == case, rest
    if case == "complete":
        assert rest.body is not None and len(rest.body) == rest.received == up.large_bytes
        assert json.loads(rest.body)["id"] == 1
        return
    assert rest.body is None
    assert rest.received <= 16 * MiB
    if case == "broken":
        assert "RemoteProtocolError" in rest.detail or "ReadError" in rest.detail, rest.detail
    else:  # the proxy's side closed the connection: the upstream saw it
        wait_for(lambda: up.endless[path]["done"], timeout=10, what="the upstream's stream to end")
        assert up.endless[path]["peer_closed"], up.endless[path]
