"""
The mitmproxy layer: the only part of receipt-proxy that imports mitmproxy.

    addons = [Receipts(), ReceiptCommands(...), ReceiptWeb(...), Watch(...), MetricsServer(...),
              ApprovalServer(...), ApprovalWebhook(...), LearnFile(), receipts.drain]

composed the way mitmproxy composes its own addons (`mitmproxy/addons/__init__.py`), each
with one job: the hooks (mitm/receipts_addon.py), the `receipts.*` commands (mitm/flow_commands.py), the Receipt
content view (web.py), the once-a-second watch over receipts and rules (watch.py), the
Prometheus endpoint (mitm/metrics_server.py, option receipts_metrics), the approval links' endpoint
(mitm/approval_server.py, receipts_approval_listen) and webhook (mitm/approval_webhook.py,
receipts_approval_webhook), the shapes of the writes seen, for `receipts rules draft --flows`
(mitm/learn_file.py, receipts_learn), and the stop on SIGTERM/SIGINT that
lets matched requests in flight end first (drain.py).
Options are declared and parsed in options.py; the store they open (Installation, gate,
PostgreSQL Listener, read connection) is mitm/receipts_db.py; the exchange that sends matched requests is
exchange.py (http1.py, its HTTP/1.1 pool; httpcore_send.py, through httpcore's pool for HTTP/2
upstreams and an upstream proxy), and the outcome it records record.py; an MCP tool call's event
stream, passed on as it comes, is streaming.py (relay.py hands it to mitmproxy's streaming);
approvals are approval.py; mitmproxy internals are internals.py.
"""

from __future__ import annotations

from proxy_addon.mitm.approval_server import ApprovalServer
from proxy_addon.mitm.approval_webhook import ApprovalWebhook
from proxy_addon.mitm.flow_commands import ReceiptCommands
from proxy_addon.mitm.learn_file import LearnFile
from proxy_addon.mitm.metrics_server import MetricsServer
from proxy_addon.mitm.receipts_addon import Receipts
from proxy_addon.mitm.watch import Watch
from proxy_addon.mitm.web import ReceiptWeb

__all__ = [
    "ApprovalServer",
    "ApprovalWebhook",
    "LearnFile",
    "MetricsServer",
    "ReceiptCommands",
    "ReceiptWeb",
    "Receipts",
    "Watch",
    "make_addons",
]


def make_addons() -> list[object]:
    receipts = Receipts()
    links = ApprovalServer(receipts)
    return [
        receipts,
        ReceiptCommands(receipts),
        ReceiptWeb(receipts.reader),
        Watch(receipts),
        MetricsServer(receipts),
        links,
        ApprovalWebhook(receipts, links.base_url),
        LearnFile(),
        receipts.drain,
    ]
