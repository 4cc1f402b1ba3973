"""
What the addon needs from mitmproxy that no public API offers: a flow's transports.

- `ack_now`: ACK a request's headers at once (TCP_QUICKACK), so a client with Nagle's
  algorithm on sends the body now.
- `close_server_connection` (and `Deadlines`, which calls it): end a flow's upstream
  exchange when our deadline passes, which `flow.kill()` cannot do to a flow in transit.
- `bound_request_body`: collect a matched request's body within a bound, in one buffer
  that becomes the request's content without a copy (`BoundedBody`).
- `skip_legacy_log_events`: our log lines skip mitmproxy's deprecated `add_log` event while
  no addon listens to it (`SkipLegacyLogEvents`).
All read mitmproxy 12's internals and do nothing when those are not there.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import socket
from collections.abc import Callable
from typing import Any

from mitmproxy import ctx, http
from mitmproxy.proxy.layer import Layer
from mitmproxy.proxy.layers.http import HttpLayer, HttpStream
from mitmproxy.proxy.utils import ReceiveBuffer

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


def skip_legacy_log_events(master: Any, prefix: str = "proxy_addon") -> None:
    """
    Let the log records of the loggers under `prefix` skip mitmproxy's deprecated `add_log`
    event while no loaded addon has an `add_log` hook. Every record still reaches the
    terminal, mitmweb's event log and any other logging handler: only the legacy event is
    skipped, which mitmproxy 12 emits for each record by scheduling a call on the event loop
    (a wake-up through its self-pipe) that dispatches the event to every addon, about
    0.15 ms a line (docs/benchmarks.md).
    """
    handler = getattr(master, "_legacy_log_events", None)
    if isinstance(handler, logging.Handler) and not any(isinstance(f, SkipLegacyLogEvents) for f in handler.filters):
        handler.addFilter(SkipLegacyLogEvents(master.addons, prefix))


class SkipLegacyLogEvents(logging.Filter):
    """mitmproxy's legacy `add_log` handler's filter: drop our records while no addon has an `add_log` hook."""

    def __init__(self, addons: Any, prefix: str) -> None:
        super().__init__()
        self._addons = addons
        self._prefix, self._dotted = prefix, prefix + "."
        self._seen: tuple = ()  # the addons last looked at (held, so that none is mistaken for a new one)
        self._listened = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != self._prefix and not record.name.startswith(self._dotted):
            return True
        loaded = tuple(getattr(self._addons, "lookup", {}).values())  # every addon registered, scripts' included
        if loaded != self._seen:
            self._seen = loaded
            self._listened = any(callable(getattr(a, "add_log", None)) for a in loaded)
        return self._listened


class BoundedBody(ReceiveBuffer):
    """
    A request body as mitmproxy collects it, in place of `HttpStream.request_body_buf`: kept up
    to `keep` bytes, and past that counted and dropped (`on_overflow` is called once, with the
    size received so far).

    mitmproxy's own buffer keeps the chunks and joins them at the end of the body, so a body
    briefly takes twice its size. This one writes them into an `io.BytesIO`, whose `getvalue()`
    hands its buffer over as the request's content without a copy.
    """

    def __init__(self, keep: int, on_overflow: Callable[[int], None]):
        super().__init__()
        self.keep = keep
        self.received = 0
        self.dropped = False
        self._on_overflow = on_overflow
        self._kept = io.BytesIO()

    def __iadd__(self, data: bytes) -> BoundedBody:
        self.received += len(data)
        if self.dropped:
            return self
        if self.received <= self.keep:
            self._kept.write(data)
        else:
            self.dropped = True
            self._kept = io.BytesIO()  # what was kept is freed: this body is never sent
            self._on_overflow(self.received)
        return self

    def __len__(self) -> int:
        return self.received

    def __bool__(self) -> bool:
        return self.received > 0

    def __bytes__(self) -> bytes:
        return b"" if self.dropped else self._kept.getvalue()

    def clear(self) -> None:
        self._kept = io.BytesIO()
        self.received = 0


def bound_request_body(flow: http.HTTPFlow, keep: int, on_overflow: Callable[[int], None]) -> bool:
    """
    From `requestheaders`: collect the flow's request body in a `BoundedBody`. False when
    mitmproxy's internals are not as expected; mitmproxy then buffers the whole body itself.
    """
    stream = _stream(flow)
    if stream is None or type(stream.request_body_buf) is not ReceiveBuffer or stream.request_body_buf:
        logger.debug(f"receipt-proxy: flow {flow.id}: mitmproxy buffers this request's body itself")
        return False
    stream.request_body_buf = BoundedBody(keep, on_overflow)
    return True


def _stream(flow: http.HTTPFlow) -> HttpStream | None:
    """The HttpStream that carries `flow`: below the client connection's layers, inside CONNECT tunnels too."""
    handler = getattr(ctx.master.addons.get("proxyserver"), "connections", {}).get(flow.client_conn.id)
    root = getattr(handler, "layer", None)
    todo: list[tuple[Any, int]] = [(root, 0)] if isinstance(root, Layer) else []
    while todo:
        layer, depth = todo.pop()
        if isinstance(layer, HttpStream) and getattr(layer, "flow", None) is flow:
            return layer
        if depth < 16:
            todo += [(child, depth + 1) for child in _children(layer)]
    return None


def _children(layer: Layer) -> list[Layer]:
    if isinstance(layer, HttpLayer):
        return list(layer.streams.values())
    out: list[Layer] = []
    # NextLayer.layer, a tunnel's or TLS layer's child_layer, or the layer a mode layer hands its events to
    for child in (
        getattr(layer, "layer", None),
        getattr(layer, "child_layer", None),
        getattr(getattr(layer, "_handle_event", None), "__self__", None),
    ):
        if isinstance(child, Layer) and child is not layer and child not in out:
            out.append(child)
    return out


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
