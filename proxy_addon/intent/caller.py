"""
Who sends a request: the parts of it that carry credentials, and the principal they make.

    c = caller_of(op, headers, key, query=query, body=body, secrets=secret_params(op, params, path), scheme=3)
    c.principal     # "hmac:…": a keyed hash of every credential part; "anonymous" when there is none
    c.counted       # ("authorization", "query:api_key", "path:token"): what it hashes, names only

No caller may be answered with another caller's recorded answer, so under fingerprint scheme 3
every part of a request that can carry a credential enters the principal:
- what the rule declares (`credentials: {header, query, body, path}`);
- `Authorization`, and every header, query parameter and top-level body field (of a form or a
  JSON object; an MCP tool call's arguments) whose name says it holds a credential
  (redaction.is_credential_name: `X-Api-Key`, `api_key`, `client_secret`, `access_token`,
  `password`), or whose value has the shape of a known token format (redaction.token_shaped);
- path parameters that carry one (secret_params): declared, named like one (`{webhook_token}`),
  token-shaped (Telegram's `/bot<token>/`), or a Slack or Discord webhook's token by its place;
- `Cookie` only when nothing else is there: a cookie jar holds more than credentials, and some
  of it changes between a request and its retry (a retry must keep its principal).
Each part is hashed with its place and name, in one order (the rule's headers as listed, then
`Authorization`, then other headers by name, then the rest by place and name): a request that
carries only credential headers has the principal scheme 2 gave it.

A request that carries none of those but has parts whose names look like credentials and which
are not counted, because they change from one request to the next (a `signature`, a `session`,
a nonce-bearing `code`), is **unidentified**: its principal is a keyed hash of those parts as
sent, so only a request with the same bytes there is the same caller, and a success is never
replayed to it (store: Attempt.unreplayable). No credential is stored, only keyed hashes.

Scheme 2 (before) counted the rule's credential headers only, else the first of Authorization
and Cookie: `caller_of(..., scheme=2)` still computes it, for receipts made then.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy_addon.intent.body_view import _MISSING, _find, _form, canonical_json, keyed_hash, multipart_parts
from proxy_addon.rules import Operation
from proxy_addon.wire.canonical import param_value
from proxy_addon.wire.jsonpath import parse_json
from proxy_addon.wire.redaction import (
    FALLBACK_CREDENTIALS,
    NOT_CALLER_HEADERS,
    is_credential_name,
    is_credential_param,
    is_secret_name,
    token_shaped,
    webhook_tokens,
)

ANONYMOUS = "anonymous"
_JSON_OBJECT = re.compile(rb"\s*\{")
_SELF_COUNTED = frozenset({"authorization", "cookie"})  # counted in their own places, never as found headers


@dataclass(frozen=True)
class Caller:
    principal: str  # a keyed hash of the parts counted, or "anonymous"
    counted: tuple[str, ...] = ()  # the parts it hashes, names only: `api-key`, `query:api_key`, `path:token`
    unidentified: tuple[str, ...] = ()  # credential-like parts hashed when nothing else tells the caller (names)


def canonical_credential(name: str, value: str) -> str:
    """
    One spelling per credential header, so that `Bearer k1`, `bearer k1` and `Bearer  k1` are
    one principal: whitespace stripped and runs of it collapsed; the auth scheme of Authorization
    and Proxy-Authorization lower-cased (RFC 9110 §11.1: schemes are case-insensitive). The
    credential itself keeps its case: tokens are case-sensitive.
    """
    text = " ".join(value.split())
    if name in ("authorization", "proxy-authorization"):
        scheme, sep, rest = text.partition(" ")
        if sep:
            return f"{scheme.lower()} {rest}"
    return text


def secret_params(op: Operation, params: Mapping[str, str], path: str) -> dict[str, str]:
    """
    The path parameters that carry a credential, with their values as text: those the rule
    declares (`credentials.path`), those named like one (`{webhook_token}`), and those whose value
    has a token's shape or is a Slack or Discord webhook's token by its place in `path`.
    """
    if not params:
        return {}
    tokens = webhook_tokens(path)
    out = {}
    for name, raw in params.items():
        value = param_value(raw)
        if name in op.credential_path or is_credential_param(name) or value in tokens or token_shaped(value):
            out[name] = value
    return out


def caller_of(
    op: Operation,
    headers: Mapping[str, str],
    key: bytes,
    *,
    scheme: int,
    query: Mapping[str, list[str]] | None = None,
    body: bytes = b"",
    secrets: Mapping[str, str] | None = None,
    arguments: Mapping[str, Any] | None = None,
    parse: Callable[[bytes], Any] = parse_json,
) -> Caller:
    """
    Who sends the request, under fingerprint `scheme`. `headers`: lower-case names; `query`: its
    parameters (name → values); `body`: the decoded body; `secrets`: secret_params; `arguments`:
    an MCP tool call's; `parse`: how the body is read as JSON (the request's one parse).
    """
    if scheme < 3:
        return _of_parts(scheme2_parts(op.credential_headers, headers), key)
    parts = header_parts(op.credential_headers, headers)
    others: dict[str, str] = {}
    for name, values in (query or {}).items():
        present = [v for v in values if v.strip()]
        if present and (name in op.credential_query or is_credential_name(name) or any(map(token_shaped, present))):
            others[f"query:{name}"] = present[0] if len(present) == 1 else canonical_json(present)
    docs = _body_documents(headers, body, parse) if body else []
    for name in op.credential_body:
        value = next((v for doc in docs if (v := _lookup(doc, name)) is not _MISSING), _MISSING)
        if (text := _text(value)) is not None:
            others[f"body:{name}"] = text
    fields = [(name, value) for doc in docs for name, value in doc.items()]
    fields += [(f"params.arguments.{name}", value) for name, value in (arguments or {}).items()]
    for name, value in fields:  # a value is made text only when it counts: a large body's fields are not copied
        counts = is_credential_name(name.rpartition(".")[2]) or (isinstance(value, str) and token_shaped(value))
        if counts and (text := _text(value)) is not None:
            others.setdefault(f"body:{name}", text)
    for name, value in (secrets or {}).items():
        others[f"path:{name}"] = value
    parts += sorted(others.items())
    if not parts:
        cookie = headers.get("cookie")
        parts = [("cookie", canonical_credential("cookie", cookie))] if cookie and cookie.strip() else []
    if parts:
        return _of_parts(parts, key)
    # Nothing identifies the caller: are there parts that look like credentials, uncounted?
    like = [(n, v) for n, v in headers.items() if n not in NOT_CALLER_HEADERS and v.strip() and is_secret_name(n)]
    like += [(f"query:{n}", canonical_json(vs)) for n, vs in (query or {}).items() if is_secret_name(n)]
    like += [
        (f"body:{n}", text)
        for n, v in fields
        if is_secret_name(n.rpartition(".")[2]) and (text := _text(v)) is not None
    ]
    if not like:
        return Caller(ANONYMOUS)
    like.sort()
    principal = keyed_hash(key, "unidentified", *(x for part in like for x in part))
    return Caller(principal, unidentified=tuple(n for n, _ in like))


def header_parts(declared: tuple[str, ...], headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """Scheme 3's credential headers: the rule's (in its order), Authorization, then any other by name or shape."""
    parts = [(n, canonical_credential(n, v)) for n in declared if (v := headers.get(n)) and v.strip()]
    if "authorization" not in declared and (v := headers.get("authorization")) and v.strip():
        parts.append(("authorization", canonical_credential("authorization", v)))
    found = sorted(
        n
        for n, v in headers.items()
        if n not in declared
        and n not in _SELF_COUNTED
        and n not in NOT_CALLER_HEADERS
        and v.strip()
        and (is_credential_name(n) or token_shaped(v))
    )
    return parts + [(n, canonical_credential(n, headers[n])) for n in found]


def scheme2_parts(declared: tuple[str, ...], headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """Scheme 2's: every credential header the rule names that is present, else the first of Authorization, Cookie."""
    present = [(n, v) for n in declared if (v := headers.get(n)) and v.strip()]
    if not present:
        present = [(n, v) for n in FALLBACK_CREDENTIALS if (v := headers.get(n)) and v.strip()][:1]
    return [(n, canonical_credential(n, v)) for n, v in present]


def _of_parts(parts: list[tuple[str, str]], key: bytes) -> Caller:
    if not parts:
        return Caller(ANONYMOUS)
    return Caller(keyed_hash(key, *(x for part in parts for x in part)), tuple(n for n, _ in parts))


def _body_documents(headers: Mapping[str, str], body: bytes, parse: Callable[[bytes], Any]) -> list[dict[str, Any]]:
    """The body's fields by name, as a server may read them: a form's, multipart's text parts, a JSON object's."""
    content_type = headers.get("content-type", "")
    ctype = content_type.split(";")[0].strip().lower()
    docs: list[dict[str, Any]] = []
    if ctype == "application/x-www-form-urlencoded" and (form := _form(body)):
        docs.append(form)
    elif ctype == "multipart/form-data" and (parts := multipart_parts(content_type, body)):
        docs.append({n: v for n, v in parts.items() if isinstance(v, str)})
    if _JSON_OBJECT.match(body) and isinstance(doc := parse(body), dict):
        docs.append(doc)
    return docs


def _lookup(doc: dict[str, Any], name: str) -> Any:
    """A declared body credential: a field by its whole name (a form's `auth[key]`), else a dotted path."""
    return doc[name] if name in doc else _find(doc, name)


def _text(value: Any) -> str | None:
    """A credential's value as text (None when absent or empty): a string as sent, anything else as JSON."""
    if value is _MISSING or value is None or value == "":
        return None
    return value if isinstance(value, str) else canonical_json(value)
