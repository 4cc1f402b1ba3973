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
  id (new on every retry) or the session (intent/tool_arguments.py); without named fields, every argument.
  The protocol revision it was sent in is noted (`mcp_revision`), never fingerprinted.
- no `fingerprint.body` in the rule: the SHA-256 of the whole body. A body that is none of
  the above, or has none of the named fields, is hashed whole too, and the intent says
  which fallback was used (`fallback`: intent_body.FALLBACKS); build_attempt logs it in one line.
- Every string that enters the fingerprint (values and keys) is in Unicode NFC; from scheme 3,
  every number is its exact value (`1.0` is 1, `1e400` is not `2e400`: intent_body.canonical_number)
  and JSON and form bodies are decoded by their declared charset (`charset=latin-1`).
- A JSON body with a key twice in one object (json_body.read_json) raises BadJson: the request
  is refused (400), never fingerprinted by one of the two readings.
- A named field that holds an object, or a list of objects, is stored as a keyed hash of
  it (`hashed`): the fingerprint still tells two objects apart, but no leaf of an object
  the rule did not name one by one (`meta.access_token`) is ever stored.
- Size: the intent is stored bounded (intent_body.bound_intent): a value larger than 4 KiB, a
  name longer than 256 characters and the fields of a part past the first 256 are stored as keyed
  hashes (noted in `bounded`). The fingerprint is taken on the whole intent, before that.
The notes (`fallback`, `missing`, `hashed`, `bounded`, `mcp_revision`) are stored with the intent and never enter
the fingerprint: the same fields read another way are the same intent.

Methods: the fingerprint and the record take the method the operation was matched with
(RuleSet.match): a POST sent as `GET` with `X-HTTP-Method-Override: POST` is the POST it names,
one intent with the same write sent as `POST`. The intent notes how it was sent
(`method_override`: {sent, override, matched}), which never enters the fingerprint.

Targets: the host and path are taken in their canonical form (wire/canonical.py), as rules match
them, and path parameters as their decoded text (`/api/%745/things` is `/api/t5/things`). A
request matched through another loopback name than the rule's (`localhost` for `127.0.0.1`)
takes the rule's name as its host (`Match.fingerprint_host`): the two spellings are one intent.
`Intent.target` is the canonical URL; `Intent.raw_target` the URL as sent, when it differs.
Both have secret-looking query values redacted, and every path segment that carries a
credential (caller.secret_params: `/bot<token>/`, a webhook's token) REDACTED.

Callers: the principal is a keyed hash of every part of the request that carries a credential,
headers, query, body and path (intent/caller.py). A path parameter that carries one enters the intent
as a keyed hash of it, never its value. A request whose caller cannot be told apart from others
(`Intent.unidentified`) has its successes never replayed (Attempt.unreplayable), nor does one
whose receipts an earlier scheme made without seeing some of its credentials.

Schemes: how a request is read changes with receipt-proxy's versions (a canonical target, a
decoded body), and a retry must stay a retry across an upgrade. `SCHEME` numbers today's way;
every receipt records it, with the digest of the rule it read (`Operation.rule_digest`), and
`build_attempt` also fingerprints a request under the earlier schemes and rules that receipts
still held can answer for (intent/earlier_fingerprints.py; scheme 1 is intent/fingerprint_v1.py). A change
that gives any request another fingerprint is a new scheme: `fingerprint(..., scheme=N)` keeps
computing each earlier one, and tests/intent/test_earlier_fingerprints.py pins them.
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

from proxy_addon.errors import UncountableWrite, UnpairedSurrogate
from proxy_addon.intent import identity
from proxy_addon.intent.body_view import (
    NOTES,
    body_view,
    bound_intent,
    canonical_json,
    intent_notes,
    keyed_hash,
    nfc,
    one_value,
)
from proxy_addon.intent.budget_charges import charges_of
from proxy_addon.intent.caller import caller_of, scheme2_parts, secret_params
from proxy_addon.intent.caller import canonical_credential as canonical_credential  # re-exported: tests import it here
from proxy_addon.intent.decisions import decide
from proxy_addon.intent.earlier_fingerprints import Version
from proxy_addon.intent.fingerprint_v1 import fingerprint_v1
from proxy_addon.intent.tool_arguments import arguments_view
from proxy_addon.rules import Match, Operation, read_variables
from proxy_addon.store import Attempt
from proxy_addon.store.records import Charge
from proxy_addon.wire.canonical import Target, method_overrides, param_value
from proxy_addon.wire.canonical import target as canonical_target
from proxy_addon.wire.json_body import read_json
from proxy_addon.wire.jsonpath import dig as dig  # re-exported: tests and older callers import it from here
from proxy_addon.wire.redaction import FALLBACK_CREDENTIALS, redact_url, webhook_tokens

logger = logging.getLogger(__name__)

_MISSING = object()

# Today's fingerprint scheme. 1: up to commit dc97d6d (intent/fingerprint_v1.py); 2: canonical targets,
# decoded and NFC bodies, hashed objects, canonical credentials; 3: (this version) every credential
# in the principal, in the query, body and path too (intent/caller.py), a path credential hashed in the intent;
# JSON numbers by their exact value and bodies by their declared charset (intent_body.BY_VALUE).
SCHEME = 3


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
    sent: bytes | None = None  # the body as sent, when it had a Content-Encoding: scheme 1 read that (None: `body`)

    @property
    def target(self) -> Target:
        """The host and path in their canonical form, as rules match them (wire/canonical.py)."""
        return canonical_target(self.scheme, self.host, self.port, self.path)


@dataclass(frozen=True)
class Intent:
    fingerprint: str
    intent: dict[str, Any]  # the sanitized, allowlisted view that is stored
    principal: str  # short keyed hash of the credentials, or "anonymous"
    target: str  # the canonical URL with secret-looking query values and path credentials redacted
    raw_target: str | None = None  # the URL as sent (redacted the same way), when it is not the canonical one
    counted: tuple[str, ...] = ()  # the parts of the request the principal hashes, names only (caller.Caller)
    unidentified: tuple[str, ...] = ()  # credential-like parts hashed for want of any that tells the caller
    read_principal: str | None = None  # the principal of its credential headers alone, when not `principal`


def principal_of(match: Match, headers: Mapping[str, str], key: bytes, *, scheme: int = SCHEME) -> str:
    """
    A keyed hash of who sends a request that has only these headers (intent/caller.py says which parts of
    a whole request count). Every credential header the rule names that is present enters it, in
    the rule's order: a key and the account it acts for (`Stripe-Account`, SendGrid's
    `on-behalf-of`, `OpenAI-Project`), so identical writes for two accounts are two principals.
    One header alone hashes as it always did.
    """
    return caller_of(match.operation, headers, key, scheme=scheme).principal


def principal(credential_headers: Sequence[str], headers: Mapping[str, str], key: bytes) -> str:
    """
    Scheme 2's principal of these headers (lower-case names) for a rule naming `credential_headers`:
    every one of them present, else the first of Authorization and Cookie. Today's principal when
    the request carries no other credential; else its receipt keeps it (`read_principal`), for
    `receipts reconcile` to check the headers a read would carry.
    """
    parts = scheme2_parts(tuple(credential_headers), headers)
    if not parts:
        return "anonymous"
    return keyed_hash(key, *(x for part in parts for x in part))


def text_headers(match: Match) -> tuple[str, ...]:
    """The headers (lower-case names) whose values the intent, the principal or the agent's key read as text:
    they must be UTF-8 (fields.undecodable), or the write is refused before its receipt."""
    op = match.operation
    key = (op.idempotency_header or "Idempotency-Key").lower()
    return (*op.fingerprint.headers, *op.credential_headers, *FALLBACK_CREDENTIALS, key)


def fingerprint(
    match: Match, req: RequestView, key: bytes, *, parse: Callable[..., Any] = read_json, scheme: int = SCHEME
) -> Intent:
    """
    The request's intent and its fingerprint, under `scheme` (2 or later; 1 is fingerprint_v1).
    `parse`: how its body is read as JSON (build_attempt: once). Raises BadJson for a JSON body
    with a key twice in one object: the request is refused, under every scheme.
    """
    if not 2 <= scheme <= SCHEME:
        raise ValueError(f"fingerprint scheme {scheme} is not one of 2..{SCHEME}")
    try:
        return _fingerprint(match, req, key, parse=parse, scheme=scheme)
    except UnicodeEncodeError:  # UTF-8 encodes every code point but a surrogate: only such text gets here
        raise UnpairedSurrogate() from None


def _fingerprint(match: Match, req: RequestView, key: bytes, *, parse: Callable[..., Any], scheme: int) -> Intent:
    op = match.operation
    spec = op.fingerprint
    where = req.target
    query: dict[str, list[str]] = {}
    for k, v in parse_qsl(urlsplit(where.path).query, keep_blank_values=True):
        query.setdefault(k, []).append(v)
    bare = where.path.partition("?")[0]
    secrets = secret_params(op, match.params, bare)  # REDACTED in the targets; hashed in the intent (scheme 3)
    intent = _intent_view(match, req, key, query, secrets, parse=parse, scheme=scheme)
    caller = caller_of(
        op,
        req.headers,
        key,
        scheme=scheme,
        query=query,
        # A rule that hashes the whole body tells two callers' bodies apart already: the body is not
        # read again for credentials (a large one is never parsed for them alone), unless it declares some.
        body=req.body if spec.body is not None or op.credential_body else b"",
        secrets=secrets,
        arguments=match.mcp_call.arguments if op.mcp_tool is not None and match.mcp_call is not None else None,
        parse=parse,
    )
    if (override := method_override_note(req, op.method)) is not None:
        intent["method_override"] = override
    digest = _digest(match, where, intent, caller.principal)
    # What a read, which sends headers only, can show it has: the principal itself when the parts
    # counted are scheme 2's credential headers, in their order (the same keyed hash); else its own.
    scheme2 = scheme2_parts(op.credential_headers, req.headers)
    same = not caller.unidentified and caller.counted == tuple(n for n, _ in scheme2)
    headers = caller.principal if same else principal(op.credential_headers, req.headers, key)
    hidden = (*secrets.values(), *webhook_tokens(bare))  # in the raw path too, however it was spelled
    return Intent(
        fingerprint=f"sha256:{digest}",
        intent=bound_intent(intent, key, lambda: read_variables(op.reconcile)),  # stored bounded, taken whole above
        principal=caller.principal,
        target=redact_url(where.scheme, where.host, where.port, where.path, keep=spec.query, secrets=hidden),
        raw_target=redact_url(req.scheme, req.host, req.port, req.path, keep=spec.query, secrets=hidden)
        if where.changed
        else None,
        counted=caller.counted,
        unidentified=caller.unidentified,
        read_principal=None if headers == caller.principal else headers,
    )


def _intent_view(
    match: Match,
    req: RequestView,
    key: bytes,
    query: dict[str, list[str]],
    secrets: dict[str, str],
    *,
    parse: Callable[..., Any],
    scheme: int,
) -> dict[str, Any]:
    """
    The allowlisted fields of the intent: path parameters (one that carries a credential as a keyed
    hash, scheme 3), query parameters, headers, and the body's fields or an MCP tool call's arguments.
    """
    op = match.operation
    spec = op.fingerprint
    intent: dict[str, Any] = {
        "path": {
            p: keyed_hash(key, "path-credential", p, secrets[p])
            if scheme >= 3 and p in secrets
            else param_value(match.params[p])
            for p in spec.path
        }
    }
    if spec.query:
        intent["query"] = {q: nfc(one_value(query.get(q))) for q in spec.query}
    if spec.headers:
        intent["headers"] = {h: req.headers.get(h) for h in spec.headers}
    if op.mcp_tool is not None and match.mcp_call is not None:
        intent.update(arguments_view(match.mcp_call, spec.body, key, scheme=scheme))  # never the JSON-RPC id or session
        if match.mcp_call.revision is not None:  # a note (NOTES): the revision a reconcile read speaks
            intent["mcp_revision"] = match.mcp_call.revision
    else:
        graphql = (op.graphql, match.graphql_args) if op.graphql and match.graphql_args is not None else None
        intent.update(body_view(spec.body, req.headers, req.body, graphql, key, parse=parse, scheme=scheme))
    return intent


def _digest(match: Match, where: Target, intent: dict[str, Any], caller_principal: str) -> str:
    """The sha256 (hex) of what the intent is: api, operation, method, host, fields (notes left out), principal."""
    op = match.operation
    material = {
        "api": op.api,
        "operation": op.name,
        "method": op.method,  # the method matched: an override header's (RuleSet.match), else the one sent
        # the host as the rule names it when the request reached it by another loopback name (RuleSet)
        "host": where.authority
        if match.fingerprint_host is None
        else replace(where, host=match.fingerprint_host).authority,
        "intent": {k: v for k, v in intent.items() if k not in NOTES},  # the same fields are the same intent
        "principal": caller_principal,
    }
    return hashlib.sha256(canonical_json(material).encode("utf-8")).hexdigest()


def method_override_note(req: RequestView, matched: str) -> dict[str, str] | None:
    """How a request carrying method override headers was sent, for the record; None without one."""
    found = method_overrides(req.headers.items())
    if not found or {m for _, m in found} == {req.method}:
        return None
    named = ", ".join(f"{h}: {m}" for h, m in found[:4]) + (", …" if len(found) > 4 else "")
    return {"sent": req.method, "override": named, "matched": matched}


def build_attempt(
    match: Match,
    req: RequestView,
    key: bytes,
    *,
    flow_id: str | None = None,
    instance: str | None = None,
    versions: Sequence[Version] = (),
) -> Attempt:
    """
    Everything the store needs to decide about a matched request before it is sent. `versions`:
    the earlier schemes and rules its operation's receipts may have been made with
    (earlier_fingerprints.Versions.of_operation), under which it is fingerprinted too.
    """
    op = match.operation
    parse = parse_once(req.body)  # the fingerprint's fields and the key's place read one parse of the body
    intent = fingerprint(match, req, key, parse=parse)
    earlier, earlier_unresolved, blind = earlier_fingerprints(match, req, key, versions, intent, parse)
    _warn_of_notes(op, intent)
    verdict = decide(op.decisions, intent.intent, intent.principal)
    if verdict.decision != "allow":
        logger.info("%s %s %s: %s", op.api, op.name, intent.target, verdict.why)
    agent_key = req.headers.get((op.idempotency_header or "Idempotency-Key").lower())
    given_key, idempotency = (
        _body_key(match, req, parse) if op.idempotency_body else (None, op.idempotency_header is not None)
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
        approval=op.approve or verdict.decision == "approve",
        approval_why=verdict.why if verdict.decision == "approve" else "approve: true" if op.approve else None,
        denied=verdict.why if verdict.decision == "deny" else None,
        decided=verdict.decision if op.decisions else None,
        charges=_charges(op, intent, verdict.decision),
        key_format=op.idempotency_format,
        given_key=given_key,
        fingerprint_scheme=SCHEME,
        fingerprint_rule=op.rule_digest,
        read_principal=intent.read_principal,
        earlier=earlier,
        earlier_unresolved=earlier_unresolved,
        # no success is replayed to a caller that cannot be told apart, nor from a receipt made by
        # a scheme that did not see all of this request's credentials (intent/caller.py)
        unreplayable=(intent.fingerprint, *earlier, *earlier_unresolved) if intent.unidentified else blind,
    )


def _warn_of_notes(op: Operation, intent: Intent) -> None:
    """Log what the intent's notes say, and a caller no credential tells apart: names and codes, never a value."""
    if notes := intent_notes(intent.intent):
        logger.warning("%s %s %s %s: %s", op.api, op.name, op.method, intent.target, "; ".join(notes))
    if intent.unidentified:
        logger.warning(
            "%s %s %s %s: no credential tells this caller apart (only %s, which are not counted): "
            "duplicates only with the same bytes there, and no success is replayed",
            op.api,
            op.name,
            op.method,
            intent.target,
            ", ".join(intent.unidentified),
        )


def _body_key(match: Match, req: RequestView, parse: Callable[..., Any]) -> tuple[str | None, bool]:
    """An id the API deduplicates by, in the body: the agent's own, or ours if there is room (else a warning)."""
    op = match.operation
    given_key, idempotency = identity.body_key(op, req.body, match.graphql_args, parse=parse)
    if not idempotency:
        logger.warning(
            "%s %s: no place for %s in this body; sent without a proxy-chosen id",
            op.api,
            op.name,
            op.idempotency_body,
        )
    return given_key, idempotency


def earlier_fingerprints(
    match: Match,
    req: RequestView,
    key: bytes,
    versions: Sequence[Version],
    today: Intent,
    parse: Callable[..., Any] = read_json,
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """
    The request's fingerprints under `versions` that differ from `today`'s: those whose receipts
    are its intent's in any state, those whose receipts are only while unresolved (an edited
    rule), and, of the first, those whose successes are never replayed to it: an earlier scheme's
    that did not count some credential this request carries (a key in its query, its body or its
    path), whose receipts may be another caller's. A version that cannot read this request (its
    rule names a path parameter the path no longer has; scheme 1 on a path only its canonical
    form matches) gives none.
    """
    anyhow: dict[str, None] = {}
    unresolved: dict[str, None] = {}
    blind: dict[str, None] = {}
    for v in versions:
        m = match if v.rule is None else replace(match, operation=match.operation.under_rule(v.rule))
        try:
            if v.scheme == 1:
                fp = fingerprint_v1(
                    m,
                    key,
                    method=req.method,
                    scheme=req.scheme,
                    host=req.host,
                    port=req.port,
                    path=req.path,
                    headers=req.headers,
                    sent=req.body if req.sent is None else req.sent,
                )
                counted: tuple[str, ...] = tuple(
                    n for n in (*m.operation.credential_headers, "authorization", "cookie") if req.headers.get(n)
                )[:1]  # fingerprint_v1.principal_v1's
            else:
                earlier = fingerprint(m, req, key, parse=parse, scheme=v.scheme)
                fp, counted = earlier.fingerprint, earlier.counted
        except (KeyError, ValueError) as e:
            logger.debug("%s %s: no fingerprint under scheme %s: %s", m.operation.api, m.operation.name, v.scheme, e)
            continue
        if fp is not None and fp != today.fingerprint:
            (unresolved if v.unresolved_only else anyhow)[fp] = None
            if not set(today.counted) <= set(counted):
                blind[fp] = None
    return tuple(anyhow), tuple(f for f in unresolved if f not in anyhow), tuple(f for f in blind if f in anyhow)


def parse_once(body: bytes) -> Callable[..., Any]:
    """
    `read_json` for the readers of one request's body: `body` is parsed at most once per charset
    it is decoded with (`parse(body)`, or `parse(body, codec)` under a declared charset: a second
    parse only when an earlier scheme reads it otherwise), when one of them reads it as JSON, and
    the document is shared (they only read it). Kept by no one after the attempt is built, so a
    large body's document is not held while it is sent.
    """
    parsed: dict[str | None, Any] = {}

    def parse(text: bytes, codec: str | None = None) -> Any:
        if text is not body:
            return read_json(text, codec)
        if codec not in parsed:
            parsed[codec] = read_json(body, codec)
        return parsed[codec]

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


def _charges(op: Operation, intent: Intent, decision: str) -> tuple[Charge, ...]:
    """
    What a new receipt of the write takes of its operation's budgets (intent/budget_charges.py). A
    denied write's count only in observe mode, where it is sent (the store charges no refused
    receipt); a deny wins over a budget: a denied write its budget cannot count takes none, never a 400.
    """
    if decision != "deny":
        return charges_of(op, intent.intent, intent.principal)
    try:
        return charges_of(op, intent.intent, intent.principal)
    except UncountableWrite:
        return ()
