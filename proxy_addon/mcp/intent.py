"""
What an MCP tool call adds to an intent: the tool's name and its arguments, never the
JSON-RPC id (new on every retry), `params._meta` or the session.

    arguments_view(call, ("params.arguments.title",), key, scheme=3)  # {"tool": ..., "body": {...title: ...}}
    arguments_view(call, None, key, scheme=3)                          # every argument

Named fields are read as any JSON body's are (intent_body: NFC, an object stored as a keyed
hash, and from fingerprint scheme 3 numbers by their exact value: `1` and `1.0` are one).
Without named fields (a rule without `fingerprint.body`, or a tool the server does not
declare read-only), every argument enters: scalars as they are, objects as keyed hashes, and
an argument whose name looks like a credential as a keyed hash too, so it is never stored.
"""

from __future__ import annotations

from typing import Any

from proxy_addon.intent_body import BY_VALUE, _fields, canonical_json, keyed_hash, nfc
from proxy_addon.mcp.calls import ToolCall
from proxy_addon.redaction import is_secret_name

PREFIX = "params.arguments."


def arguments_view(call: ToolCall, fields: tuple[str, ...] | None, key: bytes, *, scheme: int) -> dict[str, Any]:
    """The call's part of the intent under fingerprint scheme `scheme` (module docstring)."""
    doc = {"params": {"arguments": call.arguments}}
    if fields is not None:
        named = _fields("body", doc, fields, key, scheme=scheme) or {
            "body": dict.fromkeys(fields),
            "missing": list(fields),
        }
        return {"tool": call.name, **named}
    view: dict[str, Any] = {}
    hashed = []
    numbers = key if scheme >= BY_VALUE else None
    for name in sorted(call.arguments):
        value = nfc(call.arguments[name], numbers=numbers)
        if is_secret_name(name.lower()) or (isinstance(value, (dict, list)) and _holds_objects(value)):
            value = keyed_hash(key, "intent-object", canonical_json(value))
            hashed.append(PREFIX + nfc(name))
        view[PREFIX + nfc(name)] = value
    out: dict[str, Any] = {"tool": call.name, "body": view}
    if hashed:
        out["hashed"] = hashed
    return out


def _holds_objects(value: dict | list) -> bool:
    return isinstance(value, dict) or any(isinstance(v, (dict, list)) for v in value)
