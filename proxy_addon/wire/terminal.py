"""
Text that reaches a terminal: no raw control characters, whoever wrote them.

An upstream controls much of what a receipt records (a reason phrase, an error, an external
id taken from its JSON). Printed raw, `\\x1b[2J` clears the operator's screen and other
sequences can fake the CLI's output. So the `receipts` CLI writes through `EscapingWriter`,
and the proxy's own log lines pass `EscapeControls`: C0 controls (but newline and tab), DEL
and C1 controls are shown as `\\x1b`-style escapes. JSON output needs nothing: json.dumps
already escapes them.
"""

from __future__ import annotations

import logging
import re
from typing import Any, TextIO

_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """`text` with every C0 (but newline and tab), DEL and C1 control character escaped."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class EscapingWriter:
    """A text stream that escapes control characters on the way to the one it wraps."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(escape_controls(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, ...
        return getattr(self._stream, name)


class EscapeControls(logging.Filter):
    """A log filter that escapes control characters in a record's message (its arguments filled in)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        escaped = escape_controls(message)
        if escaped != message:
            record.msg, record.args = escaped, None
        return True


def escape_logs(prefix: str = "proxy_addon") -> None:
    """Install EscapeControls on every logger under `prefix` (each module logs under its own name)."""
    names = [n for n in logging.root.manager.loggerDict if n == prefix or n.startswith(prefix + ".")]
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, EscapeControls) for f in logger.filters):
            logger.addFilter(EscapeControls())
