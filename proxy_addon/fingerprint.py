"""
Intent fingerprints: what a request means, never what it carries as credentials.

`fingerprint(match, request, key)` builds the sanitized intent (only the fields
the rule allowlists), a principal (an HMAC of the credential, so two accounts
never block each other and no credential is stored), and
`sha256:<hex>` over canonical JSON of both.

Bodies (`RequestView.body` is the body with its Content-Encoding undone: bodies.decode_body):
- JSON: the allowlisted dotted fields (`article.title`, `items.0.sku`); a missing
  field counts as null (noted in `missing`).
- form-encoded: the allowlisted field names, taken literally. A JSON object sent with the
  form content type (as `curl -d` does) whose form has none of the named fields is read as
  JSON (noted as the fallback `json_sent_as_form`).
- multipart/form-data: the allowlisted part names; a file part is {filename,
  content_type, size, sha256}: its content is hashed, never kept.
- GraphQL operations: dotted paths into the root field's arguments, variables substituted.
- MCP tool calls: the tool and its arguments (`params.arguments.NAME`), never the JSON-RPC
  id (new on every retry) or the session (mcp/intent.py); without named fields, every argument.
- no `fingerprint.body` in the rule: the SHA-256 of the whole body. A body that is none of
  the above, or has none of the named fields, is hashed whole too, and the intent says
  which fallback was used (`fallback`: intent_body.FALLBACKS); build_attempt logs it in one line.
- Every string that enters the fingerprint (values and keys) is in Unicode NFC.
- A named field that holds an object, or a list of objects, is stored as a keyed hash of
  it (`hashed`): the fingerprint still tells two objects apart, but no leaf of an object
  the rule did not name one by one (`meta.access_token`) is ever stored.
- Size: the intent is stored bounded (intent_body.bound_intent): a value larger than 4 KiB, a
  name longer than 256 characters and the fields of a part past the first 256 are stored as keyed
  hashes (noted in `bounded`). The fingerprint is taken on the whole intent, before that.
The notes (`fallback`, `missing`, `hashed`, `bounded`) are stored with the intent and never enter
the fingerprint: the same fields read another way are the same intent.

Methods: the fingerprint and the record take the method the operation was matched with
(RuleSet.match): a POST sent as `GET` with `X-HTTP-Method-Override: POST` is the POST it names,
one intent with the same write sent as `POST`. The intent notes how it was sent
(`method_override`: {sent, override, matched}), which never enters the fingerprint.

Targets: the host and path are taken in their canonical form (canonical.py), as rules match
them, and path parameters as their decoded text (`/api/%745/things` is `/api/t5/things`). A
request matched through another loopback name than the rule's (`localhost` for `127.0.0.1`)
takes the rule's name as its host (`Match.fingerprint_host`): the two spellings are one intent.
`Intent.target` is the canonical URL; `Intent.raw_target` the URL as sent, when it differs.
Both have secret-looking query values redacted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from proxy_addon import identity
from proxy_addon.canonical import Target, method_overrides, param_value
from proxy_addon.canonical import target as canonical_target
from proxy_addon.errors import UnpairedSurrogate
from proxy_addon.intent_body import (
    NOTES,
    body_view,
    bound_intent,
    canonical_json,
    intent_notes,
    keyed_hash,
    nfc,
    one_value,
)
from proxy_addon.jsonpath import dig as dig  # re-exported: tests and older callers import it from here
from proxy_addon.jsonpath import parse_json
from proxy_addon.mcp.intent import arguments_view
from proxy_addon.redaction import FALLBACK_CREDENTIALS, redact_url
from proxy_addon.rules import Match, read_variables
from proxy_addon.store import Attempt

logger = logging.getLogger(__name__)

_MISSING = object()


@dataclass(frozen=True)
class RequestView:
    """The parts of an HTTP request a fingerprint may look at, as sent (`target` is their canonical form)."""

    method: str
    scheme: str
    host: str
    port: int
    path: str  # with the query string
    headers: Mapping[str, str]  # lower-case names
    body: bytes  # decoded: Content-Encoding undone (bodies.decode_body); fingerprint never decodes

    @property
    def target(self) -> Target:
        """The host and path in their canonical form, as rules match them (canonical.py)."""
        return canonical_target(self.scheme, self.host, self.port, self.path)


@dataclass(frozen=True)
class Intent:
    fingerprint: str
    intent: dict[str, Any]  # the sanitized, allowlisted view that is stored
    principal: str  # short keyed hash of the credential, or "anonymous"
    target: str  # the canonical URL with secret-looking query values redacted
    raw_target: str | None = None  # the URL as sent (redacted the same way), when it is not the canonical one


def principal_of(match: Match, headers: Mapping[str, str], key: bytes) -> str:
    """
    A keyed hash of who sends the request. Every credential header the rule names that is
    present enters it, in the rule's order: a key and the account it acts for
    (`Stripe-Account`, SendGrid's `on-behalf-of`, `OpenAI-Project`), so identical writes
    for two accounts are two principals. One header alone hashes as it always did. When the
    rule names none, or none of them is present: the first of Authorization, then Cookie.
    """
    return principal(match.operation.credential_headers, headers, key)


def principal(credential_headers: Sequence[str], headers: Mapping[str, str], key: bytes) -> str:
    """The principal of these credential headers (lower-case names) for a rule naming `credential_headers`."""
    present = [(n, v) for n in credential_headers if (v := headers.get(n)) and v.strip()]
    if not present:
        present = [(n, v) for n in FALLBACK_CREDENTIALS if (v := headers.get(n)) and v.strip()][:1]
    if not present:
        return "anonymous"
    return keyed_hash(key, *(part for name, value in present for part in (name, canonical_credential(name, value))))


def text_headers(match: Match) -> tuple[str, ...]:
    """The headers (lower-case names) whose values the intent, the principal or the agent's key read as text:
    they must be UTF-8 (fields.undecodable), or the write is refused before its receipt."""
    op = match.operation
    key = (op.idempotency_header or "Idempotency-Key").lower()
    return (*op.fingerprint.headers, *op.credential_headers, *FALLBACK_CREDENTIALS, key)


def canonical_credential(name: str, value: str) -> str:
    """
    One spelling per credential, so that `Bearer k1`, `bearer k1` and `Bearer  k1` are one
    principal: whitespace stripped and runs of it collapsed; the auth scheme of Authorization
    and Proxy-Authorization lower-cased (RFC 9110 §11.1: schemes are case-insensitive). The
    credential itself keeps its case: tokens are case-sensitive.
    """
    text = " ".join(value.split())
    if name in ("authorization", "proxy-authorization"):
        scheme, sep, rest = text.partition(" ")
        if sep:
            return f"{scheme.lower()} {rest}"
    return text


def fingerprint(match: Match, req: RequestView, key: bytes, *, parse: Callable[[bytes], Any] = parse_json) -> Intent:
    """The request's intent and its fingerprint. `parse`: how its body is read as JSON (build_attempt: once).
    UnpairedSurrogate when text entering it is no Unicode (a JSON "\\ud800" escape): it cannot be hashed."""
    try:
        return _fingerprint(match, req, key, parse=parse)
    except UnicodeEncodeError:  # UTF-8 encodes every code point but a surrogate: only such text gets here
        raise UnpairedSurrogate() from None


def _fingerprint(match: Match, req: RequestView, key: bytes, *, parse: Callable[[bytes], Any]) -> Intent:
    op = match.operation
    spec = op.fingerprint
    where = req.target
    query: dict[str, list[str]] = {}
    for k, v in parse_qsl(urlsplit(where.path).query, keep_blank_values=True):
        query.setdefault(k, []).append(v)
    intent: dict[str, Any] = {"path": {p: param_value(match.params[p]) for p in spec.path}}
    if spec.query:
        intent["query"] = {q: nfc(one_value(query.get(q))) for q in spec.query}
    if spec.headers:
        intent["headers"] = {h: req.headers.get(h) for h in spec.headers}
    if op.mcp_tool is not None and match.mcp_call is not None:
        intent.update(arguments_view(match.mcp_call, spec.body, key))  # never the JSON-RPC id or the session
    else:
        graphql = (op.graphql, match.graphql_args) if op.graphql and match.graphql_args is not None else None
        intent.update(body_view(spec.body, req.headers, req.body, graphql, key, parse=parse))
    principal = principal_of(match, req.headers, key)
    if (override := method_override_note(req, op.method)) is not None:
        intent["method_override"] = override
    material = {
        "api": op.api,
        "operation": op.name,
        "method": op.method,  # the method matched: an override header's (RuleSet.match), else the one sent
        # the host as the rule names it when the request reached it by another loopback name (RuleSet)
        "host": where.authority
        if match.fingerprint_host is None
        else replace(where, host=match.fingerprint_host).authority,
        "intent": {k: v for k, v in intent.items() if k not in NOTES},  # the same fields are the same intent
        "principal": principal,
    }
    digest = hashlib.sha256(canonical_json(material).encode("utf-8")).hexdigest()
    return Intent(
        fingerprint=f"sha256:{digest}",
        intent=bound_intent(intent, key, lambda: read_variables(op.reconcile)),  # stored bounded, taken whole above
        principal=principal,
        target=redact_url(where.scheme, where.host, where.port, where.path, keep=spec.query),
        raw_target=redact_url(req.scheme, req.host, req.port, req.path, keep=spec.query) if where.changed else None,
    )


def method_override_note(req: RequestView, matched: str) -> dict[str, str] | None:
    """How a request carrying method override headers was sent, for the record; None without one."""
    found = method_overrides(req.headers.items())
    if not found or {m for _, m in found} == {req.method}:
        return None
    named = ", ".join(f"{h}: {m}" for h, m in found[:4]) + (", …" if len(found) > 4 else "")
    return {"sent": req.method, "override": named, "matched": matched}


def build_attempt(
    match: Match, req: RequestView, key: bytes, *, flow_id: str | None = None, instance: str | None = None
) -> Attempt:
    """Everything the store needs to decide about a matched request before it is sent."""
    op = match.operation
    parse = parse_once(req.body)  # the fingerprint's fields and the key's place read one parse of the body
    intent = fingerprint(match, req, key, parse=parse)
    if notes := intent_notes(intent.intent):  # field names and codes only, never a value
        logger.warning("%s %s %s %s: %s", op.api, op.name, op.method, intent.target, "; ".join(notes))
    agent_key = req.headers.get((op.idempotency_header or "Idempotency-Key").lower())
    given_key, idempotency = None, op.idempotency_header is not None
    if op.idempotency_body:
        # An id the API deduplicates by, in the body: the agent's own, or ours if there is room.
        given_key, idempotency = identity.body_key(op, req.body, match.graphql_args, parse=parse)
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
        method=op.method,  # the method matched (an override header's), as the fingerprint takes it
        target=intent.target,
        raw_target=intent.raw_target,
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


def parse_once(body: bytes) -> Callable[[bytes], Any]:
    """
    `parse_json` for the readers of one request's body: `body` is parsed at most once, when one
    of them reads it as JSON, and the document is shared (they only read it). Kept by no one
    after the attempt is built, so a large body's document is not held while it is sent.
    """
    parsed: list[Any] = []

    def parse(text: bytes) -> Any:
        if text is not body:
            return parse_json(text)
        if not parsed:
            parsed.append(parse_json(body))
        return parsed[0]

    return parse


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
