"""
Fingerprint scheme 1: the intent fingerprint as receipt-proxy computed it before fingerprints
had a scheme (up to commit dc97d6d, before canonical targets, decoded bodies and canonical
credentials). Kept only so that, after an upgrade, a retry of a write whose receipt was made
then is still recognised (intent/earlier_fingerprints.py). No new receipt is ever made with it.

What it took, where today's scheme (intent/fingerprint.py) differs:
- the target as sent: path parameters as they appear in the path (`%74hing` is not `thing`),
  the host lower-cased without a trailing dot, the method of the request line;
- the body as sent, its Content-Encoding not undone; JSON fields as parsed, with no Unicode
  normalisation; a field holding an object taken whole; a form body read as a form only;
- the principal: the first credential present, the rule's headers, then Authorization, then
  Cookie, as sent (`Bearer` and `bearer` were two principals).

It is a copy of that commit's rules of computation, not of its code paths: the test
tests/intent/test_earlier_fingerprints.py pins it against fingerprints that commit's addon made.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from proxy_addon.intent.body_view import canonical_json, keyed_hash, multipart_parts
from proxy_addon.rules import Match
from proxy_addon.wire.jsonpath import dig

SCHEME = 1


def fingerprint_v1(
    match: Match,
    key: bytes,
    *,
    method: str,
    scheme: str,
    host: str,
    port: int,
    path: str,
    headers: Mapping[str, str],
    sent: bytes,
) -> str | None:
    """
    The scheme-1 fingerprint of a request (`sent`: its body as sent), or None where scheme 1
    would not have matched it (a path that only its canonical form matches) or had no such
    operation (MCP tool calls).
    """
    op = match.operation
    if op.mcp_tool is not None:
        return None
    raw_path = path.split("?", 1)[0]
    params = op.path.match(raw_path)
    if params is None or any(p not in params for p in op.fingerprint.path):
        return None
    spec = op.fingerprint
    query: dict[str, list[str]] = {}
    for k, v in parse_qsl(urlsplit(path).query, keep_blank_values=True):
        query.setdefault(k, []).append(v)
    intent: dict[str, Any] = {"path": {p: params[p] for p in spec.path}}
    if spec.query:
        intent["query"] = {q: _one(query.get(q)) for q in spec.query}
    if spec.headers:
        intent["headers"] = {h: headers.get(h) for h in spec.headers}
    graphql = (op.graphql, match.graphql_args) if op.graphql and match.graphql_args is not None else None
    intent.update(_body_view(spec.body, headers, sent, graphql))
    default_port = {"http": 80, "https": 443}.get(scheme)
    bare = host.lower().rstrip(".")
    material = {
        "api": op.api,
        "operation": op.name,
        "method": method,
        "host": bare if port == default_port else f"{bare}:{port}",
        "intent": intent,
        "principal": principal_v1(op.credential_headers, headers, key),
    }
    return "sha256:" + hashlib.sha256(canonical_json(material).encode("utf-8")).hexdigest()


def principal_v1(credential_headers: tuple[str, ...], headers: Mapping[str, str], key: bytes) -> str:
    """Scheme 1's principal: a keyed hash of the first credential header present, as sent."""
    for name in (*credential_headers, "authorization", "cookie"):
        value = headers.get(name)
        if value:
            return keyed_hash(key, name, value)
    return "anonymous"


def _body_view(
    fields: tuple[str, ...] | None,
    headers: Mapping[str, str],
    body: bytes,
    graphql: tuple[str, dict[str, Any]] | None,
) -> dict[str, Any]:
    if fields == ():
        return {}
    if graphql is not None and fields is not None:
        field_name, args = graphql
        return {"graphql": field_name, "body": {f: dig(args, f) for f in fields}}
    if fields is not None and body:
        content_type = headers.get("content-type", "")
        ctype = content_type.split(";")[0].strip().lower()
        if ctype == "multipart/form-data":
            parts = multipart_parts(content_type, body)
            if parts is not None:
                return {"multipart": {f: dig(parts, f) if f not in parts else parts[f] for f in fields}}
        elif ctype == "application/x-www-form-urlencoded":
            try:
                form: dict[str, list[str]] = {}
                for k, v in parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True):
                    form.setdefault(k, []).append(v)
            except (UnicodeDecodeError, ValueError):
                pass
            else:
                return {"form": {f: _one(form.get(f)) for f in fields}}
        else:
            try:
                doc = json.loads(body)
            except (ValueError, RecursionError):
                pass
            else:
                if isinstance(doc, dict):
                    return {"body": {f: dig(doc, f) for f in fields}}
    return {"body_sha256": hashlib.sha256(body).hexdigest()}


def _one(values: list[str] | None) -> Any:
    if not values:
        return None
    return values[0] if len(values) == 1 else values
