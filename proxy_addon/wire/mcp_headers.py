"""
What a request of the 2026-07-28 revision carries in HTTP headers besides its body (Streamable
HTTP, "Request Metadata"), for the requests receipt-proxy makes itself (reconcile reads:
reconcile/tool_reads.py).

    header_value("Drucker brennt ü")                  # "=?base64?RHJ1Y2tlciBicmVubnQgw7w=?="
    invalid_header_schema(tool["inputSchema"])        # None, or why the tool definition is invalid
    param_headers(tool["inputSchema"], {"title": "x"}) # {"Mcp-Param-Title": "x"}

- Value Encoding: a value that is plain visible ASCII (spaces and tabs inside it allowed) passes
  as it is; one with other characters, leading or trailing whitespace, or the sentinel's own
  shape is sent as `=?base64?<its UTF-8, base64>?=`. `Mcp-Name` is encoded the same way.
- `x-mcp-header` on a property of the tool's inputSchema names the header `Mcp-Param-<name>` that
  mirrors that argument: a string as it is, an integer in decimal, a boolean as `true`/`false`;
  an argument that is absent or null gets no header. The specification makes a tool definition
  invalid (clients MUST reject it) when an annotation is anywhere but on a property reached from
  the root through `properties` keys alone, is not an HTTP token, sits on a type other than
  string, integer or boolean, or repeats another regardless of case: `invalid_header_schema`.
Nothing here imports the MCP SDK (mcp/__init__.py).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator, Mapping
from typing import Any

X_MCP_HEADER = "x-mcp-header"
PARAM_PREFIX = "Mcp-Param-"
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token (tchar)
_PLAIN = re.compile(r"[\x21-\x7e]([\x20-\x7e\t]*[\x21-\x7e])?")  # visible ASCII, no whitespace at either end
_SENTINEL = re.compile(r"=\?base64\?.*\?=")
_TYPES = ("string", "integer", "boolean")
SAFE_INTEGER = 2**53 - 1  # integers beyond it have no header (the specification's bound)


def header_value(text: str) -> str:
    """A value as a header carries it (Value Encoding): as it is when plain, else the base64 sentinel."""
    if _PLAIN.fullmatch(text) and not _SENTINEL.fullmatch(text):
        return text
    return "=?base64?" + base64.b64encode(text.encode("utf-8")).decode("ascii") + "?="


def _annotated(schema: Any) -> Iterator[tuple[tuple[str, ...] | None, dict[str, Any]]]:
    """
    Every schema object holding `x-mcp-header`, with its property path when it is reached from
    the root through `properties` keys alone, else None (the root itself too). Iterative: a
    server's schema may nest deeply.
    """
    stack: list[tuple[Any, tuple[str, ...] | None]] = [(schema, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, list):
            stack.extend((item, None) for item in node)
            continue
        if not isinstance(node, dict):
            continue
        if X_MCP_HEADER in node:
            yield (path or None), node
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                stack.extend((sub, (*path, name) if path is not None else None) for name, sub in value.items())
            elif isinstance(value, (dict, list)):
                stack.append((value, None))


def invalid_header_schema(schema: Any) -> str | None:
    """Why a tool's inputSchema makes its definition invalid for its `x-mcp-header` annotations, or None."""
    seen: set[str] = set()
    for path, node in _annotated(schema):
        if path is None:
            return f"{X_MCP_HEADER} on a schema that is not a property reached through `properties` keys alone"
        where = ".".join(path)[:80]
        name = node[X_MCP_HEADER]
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            return f"{X_MCP_HEADER} of the property {where!r} is not an HTTP token"
        if node.get("type") not in _TYPES:
            return f"{X_MCP_HEADER} on the property {where!r}, which is not a string, an integer or a boolean"
        if name.lower() in seen:
            return f"{X_MCP_HEADER} {name[:40]!r} is given twice (regardless of case)"
        seen.add(name.lower())
    return None


def param_headers(schema: Any, arguments: Mapping[str, Any]) -> dict[str, str]:
    """The `Mcp-Param-*` headers a tools/call with these arguments carries (the schema checked valid first)."""
    headers = {}
    for path, node in _annotated(schema):
        value: Any = arguments
        for key in path or ():
            value = value.get(key) if isinstance(value, Mapping) else None
        rendered = _rendered(value)
        if rendered is not None:
            headers[PARAM_PREFIX + node[X_MCP_HEADER]] = header_value(rendered)
    return headers


def _rendered(value: Any) -> str | None:
    """An argument's value as its header says it (Type conversion), or None: no header."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return str(value) if abs(value) <= SAFE_INTEGER else None
    return value if isinstance(value, str) else None
