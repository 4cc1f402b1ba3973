"""
What the addon needs from mitmproxy that no public API offers: a flow's transports.

- `ack_now`: ACK a request's headers at once (TCP_QUICKACK), so a client with Nagle's
  algorithm on sends the body now.
- `close_server_connection` (and `Deadlines`, which calls it): end a flow's upstream
  exchange when our deadline passes, which `flow.kill()` cannot do to a flow in transit.
Both read mitmproxy 12's proxyserver internals and do nothing when those are not there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

from mitmproxy import ctx, http

logger = logging.getLogger(__name__)

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only


def ack_now(flow: http.HTTPFlow) -> None:
    """
    ACK a request's headers at once, so that a client with Nagle's algorithm on sends the body now.

    urllib3 (so requests, and the SDKs built on it) leaves Nagle's algorithm on for
    connections to a proxy, and http.client writes a request's headers and its body in two
    send() calls: the body then waits in the client's kernel until the proxy ACKs the
    headers, and Linux delays that ACK by ~40 ms on a keep-alive connection, since the
    proxy has nothing to send back until it has the body. See docs/benchmarks.md.
    """
    headers = flow.request.headers
    if _QUICKACK is None or (
        headers.get("content-length", "0").strip() in ("", "0") and "transfer-encoding" not in headers
    ):
        return
    io = _transport(flow, flow.client_conn)
    get_extra_info = getattr(getattr(io, "writer", None), "get_extra_info", None)  # mitmproxy_rs streams have no socket
    sock = get_extra_info("socket") if get_extra_info else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)


def _transport(flow: http.HTTPFlow, conn: Any) -> Any:
    """mitmproxy's transport for one side of a live flow, or None. Internals: no public API has it."""
    handler = getattr(ctx.master.addons.get("proxyserver"), "connections", {}).get(flow.client_conn.id)
    return getattr(handler, "transports", {}).get(conn) if handler else None


def close_server_connection(flow: http.HTTPFlow) -> None:
    """
    End a flow's upstream exchange. mitmproxy 12 has no public call for this
    (flow.kill() cannot stop a flow in transit).
    """
    transport = _transport(flow, flow.server_conn)
    if transport is None or transport.handler is None:
        logger.error(f"receipt-proxy: could not end the upstream exchange of flow {flow.id}")
        return
    transport.handler.cancel("receipt-proxy: upstream deadline passed")


class Deadlines:
    """Per-flow upstream deadlines when mitmproxy forwards (receipts_forward=mitmproxy)."""

    def __init__(self) -> None:
        self._handles: dict[str, asyncio.TimerHandle] = {}

    def arm(self, flow: http.HTTPFlow, seconds: float) -> None:
        self._handles[flow.id] = asyncio.get_running_loop().call_later(seconds, self._passed, flow, seconds)

    def disarm(self, flow: http.HTTPFlow) -> None:
        handle = self._handles.pop(flow.id, None)
        if handle:
            handle.cancel()

    def cancel_all(self) -> None:
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()

    def _passed(self, flow: http.HTTPFlow, seconds: float) -> None:
        self._handles.pop(flow.id, None)
        if flow.response or flow.error:
            return
        flow.metadata["receipts"]["deadline_passed"] = True
        logger.warning(
            f"receipt {flow.metadata['receipts'].get('operation_id')}: no answer within "
            f"{seconds:g}s; ending the upstream exchange"
        )
        close_server_connection(flow)
