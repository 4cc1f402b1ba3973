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

from proxy_addon.errors import BadJson
from proxy_addon.intent.body_view import BY_VALUE, _fields, canonical_json, hashed_number, keyed_hash, nfc
from proxy_addon.wire.mcp_calls import ToolCall
from proxy_addon.wire.redaction import is_secret_name

PREFIX = "params.arguments."


def arguments_view(call: ToolCall, fields: tuple[str, ...] | None, key: bytes, *, scheme: int) -> dict[str, Any]:
    """The call's part of the intent under fingerprint scheme `scheme` (module docstring)."""
    doc = {"params": {"arguments": call.arguments}}
    if fields is not None:
        refuse_case_variants(call.arguments, fields)
        named = _fields("body", doc, fields, key, scheme=scheme) or {
            "body": dict.fromkeys(fields),
            "missing": list(fields),
        }
        return {"tool": call.name, **named}
    view: dict[str, Any] = {}
    hashed = []
    numbers = key if scheme >= BY_VALUE else None
    for name in sorted(call.arguments):
        raw = call.arguments[name]
        value = nfc(raw, numbers=numbers)
        if is_secret_name(name.lower()) or (isinstance(value, (dict, list)) and _holds_objects(value)):
            value = keyed_hash(key, "intent-object", canonical_json(value))
            hashed.append(PREFIX + nfc(name))
        elif numbers is not None and hashed_number(raw, value):
            hashed.append(PREFIX + nfc(name))
        view[PREFIX + nfc(name)] = value
    out: dict[str, Any] = {"tool": call.name, "body": view}
    if hashed:
        out["hashed"] = hashed
    return out


def _holds_objects(value: dict | list) -> bool:
    return isinstance(value, dict) or any(isinstance(v, (dict, list)) for v in value)


def refuse_case_variants(arguments: dict[str, Any], fields: tuple[str, ...]) -> None:
    """
    BadJson when a named argument is absent but a key in another case is there (`Title` for
    `params.arguments.title`): a Go server decoding the arguments into its tool's struct reads
    it as that argument, where the fingerprint would count it missing, and two different
    calls would be one intent. (Keys that differ only by case in one object are refused
    before: mcp/calls.parse_message.)
    """
    for field in fields:
        value: Any = arguments
        parts = field.split(".")[2:] if field.startswith(PREFIX) else []
        for i, part in enumerate(parts):
            if not isinstance(value, dict):
                break
            if part in value:
                value = value[part]
                continue
            other = next((k for k in value if k.casefold() == part.casefold()), None)
            if other is not None:
                where = ".".join(["params", "arguments", *parts[:i]])
                raise BadJson(
                    f"the JSON-RPC body has the key {other[:60]!r} at {where}, which a server that matches keys "
                    f"regardless of case (Go's encoding/json) reads as the argument {part!r} the rule names, and "
                    f"the proxy does not; spell it {part!r}"
                )
            break
