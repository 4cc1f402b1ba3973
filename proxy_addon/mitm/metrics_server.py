"""
Serve the proxy's Prometheus metrics over HTTP: `--set receipts_metrics=HOST:PORT` (empty: off).

    --set receipts_metrics=127.0.0.1:9464    →    curl http://127.0.0.1:9464/metrics

The metrics, and recording them, are the core's (proxy_addon/gate/metrics.py: the hooks addon's
`metrics`, a registry of its own). This addon only runs prometheus_client's HTTP server over
that registry, on a thread of its own: started when the option is set, moved when it changes
(the new address is bound before the old one is let go), stopped by `done`. A value that is not
HOST:PORT, or an address that cannot be bound (a busy port, an address not on this host), is an
OptionsError naming the option: at startup the proxy stops with that one line; in mitmweb's
Options the new value is refused and the old one keeps serving.
"""

from __future__ import annotations

import logging
import threading
from typing import Any
from wsgiref.simple_server import WSGIServer

from mitmproxy import ctx, exceptions
from prometheus_client import start_http_server

from proxy_addon.mitm import options
from proxy_addon.mitm.receipts_addon import Receipts

logger = logging.getLogger(__name__)


class MetricsServer:
    def __init__(self, receipts: Receipts):
        self.receipts = receipts
        self._at: tuple[str, int] | None = None  # the HOST:PORT asked for, as parsed
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def configure(self, updated: set[str]) -> None:
        if "receipts_metrics" not in updated:
            return
        text = ctx.options.receipts_metrics
        try:
            at = options.parse_listen(text)
        except ValueError as e:
            raise exceptions.OptionsError(f"receipts_metrics: {e}") from None
        if at == self._at:
            return
        server = thread = None
        if at is not None:
            try:
                server, thread = start_http_server(at[1], at[0], registry=self.receipts.metrics.registry)
            except OSError as e:  # busy, or not an address of this host
                raise exceptions.OptionsError(
                    f"receipts_metrics: cannot serve metrics at {text}: {e.strerror or e}"
                    f"{' (another process listens there; pick another port)' if 'in use' in str(e) else ''}"
                ) from None
        self._stop()
        self._at, self._server, self._thread = at, server, thread
        if server is not None and at is not None:
            host = f"[{at[0]}]" if ":" in at[0] else at[0]
            logger.info(f"receipt-proxy: Prometheus metrics at http://{host}:{server.server_port}/metrics")

    def done(self) -> None:
        self._stop()

    def _stop(self) -> None:
        stop_serving(self._server, self._thread)
        self._server = self._thread = None
        self._at = None


def stop_serving(server: Any, thread: threading.Thread | None) -> None:
    """Stop a server run on a thread of its own (this one, approval_server.py's): its loop, socket and thread."""
    if server is not None:
        server.shutdown()
        server.server_close()
    if thread is not None:
        thread.join(timeout=5)
