"""
`receipts rules explain`: the warnings when the fields a fingerprint names cannot be read from
the body given (it is not JSON, is declared as another type, lacks some or all of them), so that
the intent would be the hash of the whole body, or hold nulls, rather than what the rule means;
with what to change (the Content-Type, or how a name is read). Names only, never values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

from proxy_addon.rules import Operation
from proxy_addon.wire.jsonpath import NOT_JSON, parse_json

# The body fallbacks (intent_body.FALLBACKS) that leave the named fields unread: the intent is the whole body's hash.
UNREAD = {
    "not_json": "it is not JSON",
    "not_a_json_object": "it is JSON but not an object, so it has no fields",
    "bad_form": "it is declared as a form (application/x-www-form-urlencoded) but is neither a form nor a JSON object",
    "bad_multipart": "it is declared as multipart/form-data but is not well-formed",
    "no_named_field": "it has none of them",
    "empty": "it is empty",
}
_NAMES_SHOWN = 12  # a body's field names listed in a warning, at most


def _body_names(ctype: str, body: bytes) -> tuple[str, list[str]] | None:
    """What the body holds, as the proxy would read it: ("JSON object" | "form", its top-level names)."""
    doc = parse_json(body)
    if isinstance(doc, dict) and ctype != "application/x-www-form-urlencoded":
        return "JSON object", list(doc)
    try:
        form = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        form = []
    if form and (ctype == "application/x-www-form-urlencoded" or doc is NOT_JSON):
        return "form", list(dict.fromkeys(k for k, _ in form))
    if isinstance(doc, dict):
        return "JSON object", list(doc)
    return None


def _hint(fallback: str, held: tuple[str, list[str]] | None, ctype: str) -> str | None:
    """What to change so that the named fields are read: the Content-Type, or how names are read."""
    if held is None:
        return None
    if held[0] == "JSON object" and ctype not in ("application/json", ""):
        return "the body is a JSON object: send it with Content-Type: application/json"
    if held[0] == "form" and ctype != "application/x-www-form-urlencoded":
        return (
            "the body is form-encoded: send it with Content-Type: application/x-www-form-urlencoded "
            "(rules explain --form), or send JSON with Content-Type: application/json"
        )
    if fallback != "no_named_field":
        return None
    if held[0] == "form":
        return (
            "a form field is read by its whole name (fingerprint.body: [metadata[order_id]] reads "
            "metadata[order_id]=…); if the API takes JSON, send JSON with Content-Type: application/json"
        )
    return 'a name in fingerprint.body is a dotted path into the JSON: article.title reads {"article": {"title": …}}'


def body_warnings(op: Operation, intent: Mapping[str, Any], headers: Mapping[str, str], body: bytes) -> list[str]:
    """
    Why the fingerprint's named body fields cannot be applied to this body, and what to do: the
    intent then falls back to the whole body's SHA-256 (`fallback`), or counts a missing field as
    null (`missing`). Names only, never values. Empty when the fields were read as the rule says.
    """
    fields = op.fingerprint.body
    if not fields:
        return []
    named = ", ".join(fields)
    ctype = headers.get("content-type", "").split(";")[0].strip().lower()
    warnings = []
    fallback = intent.get("fallback")
    if fallback in UNREAD:
        why = UNREAD[fallback]
        held = _body_names(ctype, body) if body else None
        if fallback == "no_named_field":
            if op.graphql:
                why = "the mutation's arguments have none of them"
            elif held is not None and held[1]:
                more = "…" if len(held[1]) > _NAMES_SHOWN else ""
                why += f" (read as a {held[0]}, its fields are: {', '.join(held[1][:_NAMES_SHOWN])}{more})"
        declared = f"Content-Type {ctype}" if ctype else "no Content-Type"
        instead = (
            "The intent is the SHA-256 of the empty body instead: every request of this operation without a body "
            "(the same path and credentials) is one intent"
            if fallback == "empty"
            else "The intent is the SHA-256 of the whole body instead: a repeat is recognised only when it is the "
            "same byte for byte (another key order, spacing or value of a field the rule leaves out makes another "
            "intent)"
        )
        warnings.append(
            f"the fingerprint's named fields ({named}) cannot be read from this body ({declared}): {why}. {instead}"
        )
        hint = None if op.graphql else _hint(fallback, held, ctype)  # GraphQL: paths into the mutation's arguments
        if hint:
            warnings.append(hint)
    if missing := intent.get("missing"):
        warnings.append(
            f"named fields not in this body: {', '.join(missing)}; each counts as null, so the same request with "
            "them is another intent"
        )
    return warnings
