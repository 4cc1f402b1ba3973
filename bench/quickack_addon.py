"""
The requests-stall remedy on the proxy side, alone: a mitmproxy script that does nothing
but set TCP_QUICKACK on the client socket when a request's headers arrive.

Why (see docs/benchmarks.md): urllib3 leaves Nagle's algorithm on for connections to a
proxy and http.client sends a request's headers and body in two send() calls, so the
body waits in the client's kernel until the proxy ACKs the headers, and Linux delays
that ACK by ~40 ms. Setting TCP_QUICKACK sends the pending ACK at once.
"""

import contextlib
import logging
import socket

from mitmproxy import ctx, http

QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only


def running() -> None:
    logging.getLogger("bench").info(
        f"bench-quickack: ready (TCP_QUICKACK {'available' if QUICKACK else 'unavailable'})"
    )


def requestheaders(flow: http.HTTPFlow) -> None:
    if QUICKACK is None:
        return
    handler = getattr(ctx.master.addons.get("proxyserver"), "connections", {}).get(flow.client_conn.id)
    io = handler.transports.get(flow.client_conn) if handler else None
    get_info = getattr(getattr(io, "writer", None), "get_extra_info", None)
    sock = get_info("socket") if get_info else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
