"""
receipts_log_format=json: every line the addon logs is one JSON object, on the handlers mitmproxy logs
to (mitmdump's terminal, mitmweb's event log); mitmproxy's own lines stay as they are. Text is the
default.

    {"time": "2026-05-01T12:00:00.123Z", "level": "warning", "event": "receipt 01J...: duplicate blocked
     (outcome_unknown)", "logger": "proxy_addon.mitm.receipts_addon", "receipt": "01J...", "api": "dev.to",
     "operation": "articles.create", "state": "outcome_unknown", "reason": "...", "trace_id": "4bf9..."}

`event` is the text line as it is today (the same redaction: nothing more is logged, only framed);
`receipt`, `api`, `operation`, `state` and `reason` are those of the write whose hook logged the line
(`current`, set by the hooks while json is on; a line outside any write has the receipt its text
names, if any), `trace_id` its span's while OpenTelemetry is on. A key with no value is left out; a
traceback is in `exception`, inside the same one line.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy_addon.mitm.flow_spans import FlowSpans

__all__ = ["FORMATS", "JsonLines", "configure", "current"]

FORMATS = ("text", "json")
PREFIX = "proxy_addon"  # the addon's loggers: each module logs under its own name
RECEIPT = re.compile(r"\breceipt ([0-9A-Za-z_-]{8,64})\b")
FIELDS = ("api", "operation", "state", "reason")

# The receipt metadata of the write whose hook runs now (mitm/receipts_addon.py sets it while json is on).
current: contextvars.ContextVar[dict | None] = contextvars.ContextVar("receipt_log_meta", default=None)


class JsonLines(logging.Formatter):
    """The addon's records as one JSON object a line; any other record as `fallback` formats it."""

    def __init__(self, fallback: logging.Formatter | None, traces: FlowSpans | None) -> None:
        super().__init__()
        self.fallback = fallback
        self.traces = traces

    def format(self, record: logging.LogRecord) -> str:
        if not (record.name == PREFIX or record.name.startswith(PREFIX + ".")):
            return self.fallback.format(record) if self.fallback is not None else super().format(record)
        message = record.getMessage()
        line: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": message,
            "logger": record.name,
        }
        meta = current.get() or {}
        receipt = meta.get("operation_id") or ((m := RECEIPT.search(message)) and m.group(1))
        if receipt:
            line["receipt"] = receipt
        line.update({k: str(meta[k]) for k in FIELDS if meta.get(k) is not None})
        if meta.get("outcome") and meta.get("state") in ("submitted", "awaiting_approval"):
            line["state"] = str(meta["outcome"])  # classified, and being recorded as this line is logged
        if self.traces is not None and (trace_id := self.traces.spans.trace_id()) is not None:
            line["trace_id"] = trace_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(fmt: str, traces: FlowSpans | None) -> None:
    """Put JsonLines on every handler of the root logger (json), or take it off again (text)."""
    for handler in logging.getLogger().handlers:
        formatter = handler.formatter
        fallback = formatter.fallback if isinstance(formatter, JsonLines) else formatter
        handler.setFormatter(JsonLines(fallback, traces) if fmt == "json" else fallback)
