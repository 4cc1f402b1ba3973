"""
Intent fingerprints: what a request means, never what it carries as credentials.

`fingerprint(match, request, key)` builds the sanitized intent (only the fields
the rule allowlists), a principal (an HMAC of the credential, so two accounts
never block each other and no credential is stored), and
`sha256:<hex>` over canonical JSON of both.

Bodies:
- JSON: the allowlisted dotted fields (`article.title`, `items.0.sku`); a missing
  field counts as null.
- form-encoded: the allowlisted field names, taken literally.
- multipart/form-data: the allowlisted part names; a file part is {filename,
  content_type, size, sha256}: its content is hashed, never kept.
- GraphQL operations: dotted paths into the root field's arguments, variables substituted.
- anything else, or no `fingerprint.body` in the rule: the SHA-256 of the whole body.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from proxy_addon import identity
from proxy_addon.jsonpath import dig, parse_json
from proxy_addon.redaction import credential_names, redact_url
from proxy_addon.rules import Match
from proxy_addon.store import Attempt

logger = logging.getLogger(__name__)

_MISSING = object()


@dataclass(frozen=True)
class RequestView:
    """The parts of an HTTP request a fingerprint may look at."""

    method: str
    scheme: str
    host: str
    port: int
    path: str  # with the query string
    headers: Mapping[str, str]  # lower-case names
    body: bytes


@dataclass(frozen=True)
class Intent:
    fingerprint: str
    intent: dict[str, Any]  # the sanitized, allowlisted view that is stored
    principal: str  # short keyed hash of the credential, or "anonymous"
    target: str  # the URL with secret-looking query values redacted


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def multipart_parts(content_type: str, body: bytes) -> dict[str, Any] | None:
    """
    The parts of a multipart/form-data body by name: a text part as its text, a file part
    (one with a filename, or not UTF-8) as {filename, content_type, size, sha256}. The
    content of a file is hashed, never kept. None when the body is not well-formed.
    """
    params = Message()
    params["content-type"] = content_type
    boundary = params.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        return None
    delimiter = b"--" + boundary.encode("latin-1")
    chunks = body.split(delimiter)
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        return None  # no closing delimiter: truncated or not multipart
    parts: dict[str, Any] = {}
    for chunk in chunks[1:-1]:
        chunk = chunk.removeprefix(b"\r\n").removesuffix(b"\r\n")
        head, sep, content = chunk.partition(b"\r\n\r\n")
        if not sep:
            return None
        headers = Message()
        for line in head.decode("latin-1").split("\r\n"):
            header, colon, header_value = line.partition(":")
            if not colon:
                return None
            headers[header.strip()] = header_value.strip()
        disposition = headers.get("content-disposition", "")
        if not disposition.lower().startswith("form-data"):
            return None
        name = headers.get_param("name", header="content-disposition")
        filename = headers.get_param("filename", header="content-disposition")
        if not isinstance(name, str):
            return None
        value: Any
        try:
            text = content.decode("utf-8") if filename is None else None
        except UnicodeDecodeError:
            text = None
        if text is not None:
            value = text
        else:
            value = {
                "filename": filename if isinstance(filename, str) else None,
                "content_type": headers.get("content-type"),
                "size": len(content),
                "sha256": hashlib.sha256(content).hexdigest(),
            }
        if name in parts:
            value = (parts[name] if isinstance(parts[name], list) else [parts[name]]) + [value]
        parts[name] = value
    return parts


def _body_view(
    fields: tuple[str, ...] | None,
    headers: Mapping[str, str],
    body: bytes,
    graphql: tuple[str, dict[str, Any]] | None = None,
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
            doc = parse_json(body)  # not JSON, or nested too deeply to parse: hashed whole
            if isinstance(doc, dict):  # a bare number, string or list has no fields: hashed whole
                return {"body": {f: dig(doc, f) for f in fields}}
    # Not JSON or form, or the rule names no fields: the whole body identifies the intent.
    return {"body_sha256": hashlib.sha256(body).hexdigest()}


def _one(values: list[str] | None) -> Any:
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def principal_of(match: Match, headers: Mapping[str, str], key: bytes) -> str:
    """A keyed hash of the first credential present: the rule's header, Authorization, then Cookie."""
    for name in credential_names(match.operation.credential_headers):
        value = headers.get(name)
        if value:
            return keyed_hash(key, name, value)
    return "anonymous"


def keyed_hash(key: bytes, *parts: str) -> str:
    """An HMAC of `parts`, for identities that must not be stored in the clear (an agent's Idempotency-Key)."""
    return "hmac:" + hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()[:32]


def fingerprint(match: Match, req: RequestView, key: bytes) -> Intent:
    op = match.operation
    spec = op.fingerprint
    query: dict[str, list[str]] = {}
    for k, v in parse_qsl(urlsplit(req.path).query, keep_blank_values=True):
        query.setdefault(k, []).append(v)
    intent: dict[str, Any] = {"path": {p: match.params[p] for p in spec.path}}
    if spec.query:
        intent["query"] = {q: _one(query.get(q)) for q in spec.query}
    if spec.headers:
        intent["headers"] = {h: req.headers.get(h) for h in spec.headers}
    graphql = (op.graphql, match.graphql_args) if op.graphql and match.graphql_args is not None else None
    intent.update(_body_view(spec.body, req.headers, req.body, graphql))
    principal = principal_of(match, req.headers, key)
    default_port = {"http": 80, "https": 443}.get(req.scheme)
    bare = req.host.lower().rstrip(".")
    host = bare if req.port == default_port else f"{bare}:{req.port}"
    material = {
        "api": op.api,
        "operation": op.name,
        "method": req.method,
        "host": host,
        "intent": intent,
        "principal": principal,
    }
    digest = hashlib.sha256(canonical_json(material).encode("utf-8")).hexdigest()
    return Intent(
        fingerprint=f"sha256:{digest}",
        intent=intent,
        principal=principal,
        target=redact_url(req.scheme, req.host, req.port, req.path),
    )


def build_attempt(
    match: Match, req: RequestView, key: bytes, *, flow_id: str | None = None, instance: str | None = None
) -> Attempt:
    """Everything the store needs to decide about a matched request before it is sent."""
    op = match.operation
    intent = fingerprint(match, req, key)
    agent_key = req.headers.get((op.idempotency_header or "Idempotency-Key").lower())
    given_key, idempotency = None, op.idempotency_header is not None
    if op.idempotency_body:
        # An id the API deduplicates by, in the body: the agent's own, or ours if there is room.
        given_key, idempotency = identity.body_key(op, req.body, match.graphql_args)
        if not idempotency:
            logger.warning(
                "%s %s: no place for %s in this body; sent without a proxy-chosen id",
                op.api,
                op.name,
                op.idempotency_body,
            )
    return Attempt(
        api=op.api,
        operation=op.name,
        method=req.method,
        target=intent.target,
        intent_fingerprint=intent.fingerprint,
        intent=intent.intent,
        principal=intent.principal,
        flow_id=flow_id,
        instance=instance,
        client_key=keyed_hash(key, intent.principal, agent_key) if agent_key else None,
        idempotency=idempotency,
        approval=op.approve,
        key_format=op.idempotency_format,
        given_key=given_key,
    )


def load_or_create_key(path: str | Path) -> bytes:
    """The per-installation HMAC key, created on first use with mode 0600."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not p.exists():
        # Write a temporary file, then link it into place: no reader ever sees a partial key.
        tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_hex(32).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, p)
        except FileExistsError:
            pass  # another process made it first: use theirs
        finally:
            tmp.unlink()
    key = p.read_bytes().strip()
    if len(key) < 32:
        raise ValueError(f"{p}: the HMAC key file is shorter than 32 bytes; delete it to make a new one")
    return key
