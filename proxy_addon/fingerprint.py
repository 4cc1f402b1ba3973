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
- no `fingerprint.body` in the rule: the SHA-256 of the whole body. A body that is none of
  the above, or has none of the named fields, is hashed whole too, and the intent says
  which fallback was used (`fallback`: FALLBACKS); build_attempt logs it in one line.
- Every string that enters the fingerprint (values and keys) is in Unicode NFC.
- A named field that holds an object, or a list of objects, is stored as a keyed hash of
  it (`hashed`): the fingerprint still tells two objects apart, but no leaf of an object
  the rule did not name one by one (`meta.access_token`) is ever stored.
The notes (`fallback`, `missing`, `hashed`) are stored with the intent and never enter the
fingerprint: the same fields read another way are the same intent.

Methods: the fingerprint and the record take the method the operation was matched with
(RuleSet.match): a POST sent as `GET` with `X-HTTP-Method-Override: POST` is the POST it names,
one intent with the same write sent as `POST`. The intent notes how it was sent
(`method_override`: {sent, override, matched}), which never enters the fingerprint.

Targets: the host and path are taken in their canonical form (canonical.py), as rules match
them, and path parameters as their decoded text (`/api/%745/things` is `/api/t5/things`).
`Intent.target` is the canonical URL; `Intent.raw_target` the URL as sent, when it differs.
Both have secret-looking query values redacted.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from proxy_addon import identity
from proxy_addon.canonical import Target, method_overrides, param_value
from proxy_addon.canonical import target as canonical_target
from proxy_addon.jsonpath import NOT_JSON, parse_json
from proxy_addon.jsonpath import dig as dig  # re-exported: tests and older callers import it from here
from proxy_addon.redaction import credential_names, redact_url
from proxy_addon.rules import Match
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


# Notes stored with the intent when the body could not be read as the rule says, or the method
# was named by an override header. They are shown (Receipt view, rules explain, one warning line)
# but never enter the fingerprint.
NOTES = ("fallback", "missing", "hashed", "method_override")
FALLBACKS = {
    "json_sent_as_form": "the body is a JSON object sent as application/x-www-form-urlencoded (as curl -d sends "
    "it), and the form has none of the named fields: the fields were read from the JSON",
    "not_json": "the body is not JSON (or nested too deeply to parse): the fingerprint uses the SHA-256 of the "
    "whole body",
    "not_a_json_object": "the body is JSON but not an object, so it has no fields: the fingerprint uses the "
    "SHA-256 of the whole body",
    "bad_form": "the body is neither valid application/x-www-form-urlencoded nor a JSON object: the fingerprint "
    "uses the SHA-256 of the whole body",
    "bad_multipart": "the body is not well-formed multipart/form-data: the fingerprint uses the SHA-256 of the "
    "whole body",
    "no_named_field": "the body has none of the named fields: the fingerprint uses the SHA-256 of the whole body",
    "empty": "the body is empty: the fingerprint uses the SHA-256 of the empty body",
}


def intent_notes(intent: Mapping[str, Any]) -> list[str]:
    """How the stored intent says its body (and method) was read, as sentences (empty when as the rule says)."""
    notes = []
    if isinstance(override := intent.get("method_override"), dict):
        sent, named, matched = override.get("sent"), override.get("override"), override.get("matched")
        notes.append(f"sent as {sent} with {named}: matched and fingerprinted as {matched}; forwarded as sent")
    if intent.get("fallback"):
        notes.append(f"fallback {intent['fallback']}: {FALLBACKS.get(intent['fallback'], 'see docs/rules.md')}")
    if intent.get("missing"):
        notes.append(f"named fields not in the body, counted as null: {', '.join(intent['missing'])}")
    if intent.get("hashed"):
        notes.append(
            f"named fields that hold an object (or a list of objects), stored as a keyed hash of it, never its "
            f"values: {', '.join(intent['hashed'])} (name its leaves one by one, e.g. {intent['hashed'][0]}.id, "
            "to store them)"
        )
    return notes


def nfc(value: Any) -> Any:
    """`value` with every string in it, object keys too, in Unicode NFC: `café` is one text however it is
    composed. Iterative, as parsed JSON may nest deeper than Python's recursion limit."""
    if isinstance(value, str):
        return _nfc_text(value)
    if not isinstance(value, (dict, list)):
        return value
    top: Any = {} if isinstance(value, dict) else []
    stack = [(value, top)]
    while stack:
        src, dst = stack.pop()
        for k, v in src.items() if isinstance(src, dict) else enumerate(src):
            if isinstance(v, (dict, list)):
                new: Any = {} if isinstance(v, dict) else []
                stack.append((v, new))
            else:
                new = _nfc_text(v) if isinstance(v, str) else v
            if isinstance(dst, dict):
                dst[_nfc_text(k) if isinstance(k, str) else k] = new
            else:
                dst.append(new)
    return top


def _nfc_text(text: str) -> str:
    return text if text.isascii() or unicodedata.is_normalized("NFC", text) else unicodedata.normalize("NFC", text)


def _find(value: Any, dotted: str) -> Any:
    """The value at a dotted path in parsed JSON (as jsonpath.dig), `_MISSING` when there is none.
    A key written in another Unicode normal form than the rule's name is the same key."""
    for part in _nfc_text(dotted).split("."):
        if isinstance(value, dict):
            if part in value:
                value = value[part]
                continue
            value = next((v for k, v in value.items() if not k.isascii() and _nfc_text(k) == part), _MISSING)
            if value is _MISSING:
                return _MISSING
        elif isinstance(value, list) and part.isdecimal() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _literal(doc: dict[str, Any], name: str) -> Any:
    """A form field or multipart part by its whole name (`metadata[order_id]`, `order.title`), `_MISSING` if none."""
    return doc.get(_nfc_text(name), _MISSING)


def _part(doc: dict[str, Any], name: str) -> Any:
    """A multipart part by its whole name, else a dotted path into it (`file.filename`)."""
    value = _literal(doc, name)
    return _find(doc, name) if value is _MISSING else value


def _fields(
    kind: str,
    doc: Any,
    fields: tuple[str, ...],
    key: bytes,
    *,
    lookup: Callable[[Any, str], Any] = _find,
    objects: bool = True,
) -> dict[str, Any]:
    """
    The named fields of a parsed body, NFC-normalised, with notes: a missing field counts as
    null (`missing`); a field that holds an object or a list of objects is stored as a keyed
    hash of it (`hashed`), so that two different objects still differ but none of their leaves
    (a token under an unnamed key) is stored. `objects=False` keeps objects (multipart's own
    summary of a file part). `{}` when none of the fields is there.
    """
    view: dict[str, Any] = {}
    missing, hashed = [], []
    for f in fields:
        value = lookup(doc, f)
        if value is _MISSING:
            missing.append(f)
            value = None
        value = nfc(value)
        if objects and (
            isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value))
        ):
            value = keyed_hash(key, "intent-object", canonical_json(value))
            hashed.append(f)
        view[f] = value
    if len(missing) == len(fields):
        return {}
    out: dict[str, Any] = {kind: view}
    if missing:
        out["missing"] = missing
    if hashed:
        out["hashed"] = hashed
    return out


def _form(body: bytes) -> dict[str, Any] | None:
    """An application/x-www-form-urlencoded body as {name: value or [values]} (NFC), or None if it is not one."""
    try:
        form: dict[str, list[str]] = {}
        for k, v in parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True):
            form.setdefault(_nfc_text(k), []).append(_nfc_text(v))
    except (UnicodeDecodeError, ValueError):
        return None
    return {k: _one(v) for k, v in form.items()}


def _whole(body: bytes, fallback: str | None) -> dict[str, Any]:
    view: dict[str, Any] = {"body_sha256": hashlib.sha256(body).hexdigest()}
    if fallback:
        view["fallback"] = fallback
    return view


def _body_view(
    fields: tuple[str, ...] | None,
    headers: Mapping[str, str],
    body: bytes,
    graphql: tuple[str, dict[str, Any]] | None = None,
    key: bytes = b"",
) -> dict[str, Any]:
    """
    The body's part of the intent. `body` is the decoded body (bodies.decode_body). When the
    named fields cannot be read as the rule says, the view says which fallback it used
    (`fallback`, see FALLBACKS), and which named fields were missing or hashed.
    """
    if fields == ():
        return {}
    if fields is None:  # the rule names no fields: the whole body identifies the intent, by design
        return _whole(body, None)
    if graphql is not None:
        field_name, args = graphql
        return {"graphql": field_name, **(_fields("body", args, fields, key) or _whole(body, "no_named_field"))}
    if not body:
        return _whole(body, "empty")
    content_type = headers.get("content-type", "")
    ctype = content_type.split(";")[0].strip().lower()
    if ctype == "multipart/form-data":
        parts = multipart_parts(content_type, body)
        if parts is None:
            return _whole(body, "bad_multipart")
        view = _fields("multipart", nfc(parts), fields, key, lookup=_part, objects=False)
        return view or _whole(body, "no_named_field")
    doc = parse_json(body)
    if ctype == "application/x-www-form-urlencoded":
        form = _form(body)
        if form is not None:
            view = _fields("form", form, fields, key, lookup=_literal)
            if view:
                return view
        # None of the named fields as a form: a JSON object sent with a form content type (curl -d)?
        view = _fields("body", doc, fields, key) if isinstance(doc, dict) else {}
        if view:
            return {**view, "fallback": "json_sent_as_form"}
        return _whole(body, "bad_form" if form is None and not isinstance(doc, dict) else "no_named_field")
    if not isinstance(doc, dict):  # not JSON, nested too deeply, or a bare number, string or list: no fields
        return _whole(body, "not_json" if doc is NOT_JSON else "not_a_json_object")
    return _fields("body", doc, fields, key) or _whole(body, "no_named_field")


def _one(values: list[str] | None) -> Any:
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def principal_of(match: Match, headers: Mapping[str, str], key: bytes) -> str:
    """A keyed hash of the first credential present: the rule's header, Authorization, then Cookie."""
    for name in credential_names(match.operation.credential_headers):
        value = headers.get(name)
        if value and value.strip():
            return keyed_hash(key, name, canonical_credential(name, value))
    return "anonymous"


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


def keyed_hash(key: bytes, *parts: str) -> str:
    """An HMAC of `parts`, for identities that must not be stored in the clear (an agent's Idempotency-Key)."""
    return "hmac:" + hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()[:32]


def fingerprint(match: Match, req: RequestView, key: bytes) -> Intent:
    op = match.operation
    spec = op.fingerprint
    where = req.target
    query: dict[str, list[str]] = {}
    for k, v in parse_qsl(urlsplit(where.path).query, keep_blank_values=True):
        query.setdefault(k, []).append(v)
    intent: dict[str, Any] = {"path": {p: param_value(match.params[p]) for p in spec.path}}
    if spec.query:
        intent["query"] = {q: nfc(_one(query.get(q))) for q in spec.query}
    if spec.headers:
        intent["headers"] = {h: req.headers.get(h) for h in spec.headers}
    graphql = (op.graphql, match.graphql_args) if op.graphql and match.graphql_args is not None else None
    intent.update(_body_view(spec.body, req.headers, req.body, graphql, key))
    principal = principal_of(match, req.headers, key)
    if (override := method_override_note(req, op.method)) is not None:
        intent["method_override"] = override
    material = {
        "api": op.api,
        "operation": op.name,
        "method": op.method,  # the method matched: an override header's (RuleSet.match), else the one sent
        "host": where.authority,
        "intent": {k: v for k, v in intent.items() if k not in NOTES},  # the same fields are the same intent
        "principal": principal,
    }
    digest = hashlib.sha256(canonical_json(material).encode("utf-8")).hexdigest()
    return Intent(
        fingerprint=f"sha256:{digest}",
        intent=intent,
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
    intent = fingerprint(match, req, key)
    if notes := intent_notes(intent.intent):  # field names and codes only, never a value
        logger.warning("%s %s %s %s: %s", op.api, op.name, op.method, intent.target, "; ".join(notes))
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
