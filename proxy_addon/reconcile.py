"""
Resolve an unknown outcome with a read, never another write.

    receipt = store.claim_for_reconcile(id, actor="cli")      # outcome_unknown → reconciling
    read = plan_read(op, receipt)                              # GET/HEAD from the rule's template
    verdict = judge(op.reconcile, read, *perform_read(read, credentials))
    store.transition(id, verdict.state, reason=verdict.reason, expect=[State.RECONCILING], ...)

`reconcile()` does the four steps for the CLI; the addon runs the same steps around an
async read. The verdict:
- the effect was found → succeeded (with the found item's external id);
- absence is proven by the read and the rule allows a retry → safe_to_retry;
- anything else (absent but not provable, no reconcile spec, a read that failed) →
  manual_review, with the reason. It is never guessed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urljoin

import httpx

from proxy_addon.classify import external_id_of
from proxy_addon.errors import ReceiptsError
from proxy_addon.fingerprint import dig, redact_url
from proxy_addon.rules import _TEMPLATE_VAR, Operation, ReconcileSpec
from proxy_addon.states import State
from proxy_addon.store import Receipt, Store

READ_METHODS = ("GET", "HEAD")


class ReconcileError(ReceiptsError):
    """A reconcile read could not be planned or performed."""


@dataclass(frozen=True)
class ReadRequest:
    method: str
    url: str

    @property
    def shown(self) -> str:
        """The URL as it may be stored and logged: secret-looking query values redacted."""
        u = httpx.URL(self.url)
        return redact_url(u.scheme, u.host, u.port or {"http": 80, "https": 443}[u.scheme], u.raw_path.decode())


@dataclass(frozen=True)
class Verdict:
    state: State
    reason: str
    external_id: str | None = None


def _variables(receipt: Receipt) -> dict[str, Any]:
    intent = receipt.intent
    out: dict[str, Any] = {"external_id": receipt.external_id}
    out.update({f"path.{k}": v for k, v in intent.get("path", {}).items()})
    out.update({f"query.{k}": v for k, v in intent.get("query", {}).items()})
    out.update({f"header.{k}": v for k, v in intent.get("headers", {}).items()})
    out.update({f"intent.{k}": v for k, v in (intent.get("body") or intent.get("form") or {}).items()})
    return out


def render(template: str, receipt: Receipt, *, url: bool = False) -> str:
    """Fill `{intent.x}`, `{path.x}`, `{query.x}`, `{header.x}` and `{external_id}` from the receipt."""
    values = _variables(receipt)

    def one(m) -> str:
        value = values.get(m.group(1))
        if value is None:
            raise ReconcileError(f"{{{m.group(1)}}} has no value in receipt {receipt.operation_id}")
        text = value if isinstance(value, str) else json.dumps(value)
        return quote(text, safe="") if url else text

    return _TEMPLATE_VAR.sub(one, template)


def plan_read(op: Operation, receipt: Receipt) -> ReadRequest:
    spec = op.reconcile
    if spec is None:
        raise ReconcileError(f"operation {op.api} {op.name} has no reconcile spec")
    url = urljoin(receipt.target, render(spec.url, receipt, url=True))
    return ReadRequest(spec.method, url)


def credentials_from(op: Operation, headers: Mapping[str, str]) -> dict[str, str]:
    """The credential headers of a request (lower-case names): the rule's, Authorization, Cookie."""
    return {h: headers[h] for h in (*op.credential_headers, "authorization", "cookie") if headers.get(h)}


def _check(read: ReadRequest) -> None:
    if read.method not in READ_METHODS:
        raise ReconcileError(f"refusing {read.method} {read.shown}: a reconcile read is GET or HEAD, never a write")


def perform_read(read: ReadRequest, credentials: Mapping[str, str], *, timeout: float = 30.0,
                 verify: Any = True) -> tuple[int, bytes]:
    _check(read)
    with httpx.Client(timeout=timeout, verify=verify, trust_env=False, follow_redirects=True) as client:
        r = client.request(read.method, read.url, headers=dict(credentials))
        return r.status_code, r.content


async def perform_read_async(read: ReadRequest, credentials: Mapping[str, str], *, timeout: float = 30.0,
                             verify: Any = True) -> tuple[int, bytes]:
    _check(read)
    async with httpx.AsyncClient(timeout=timeout, verify=verify, trust_env=False, follow_redirects=True) as client:
        r = await client.request(read.method, read.url, headers=dict(credentials))
        return r.status_code, r.content


def judge(spec: ReconcileSpec, read: ReadRequest, receipt: Receipt, status: int, body: bytes) -> Verdict:
    """What the read proves."""
    said = f"read {read.method} {read.shown} → HTTP {status}"
    if not spec.find:
        if 200 <= status < 300:
            return Verdict(State.SUCCEEDED, f"{said}: found", external_id_of(body, spec.external_id) or receipt.external_id)
        if status in (404, 410):
            return _absent(spec, said)
        return Verdict(State.MANUAL_REVIEW, f"{said}: the read failed, nothing is proven")
    if not 200 <= status < 300:
        return Verdict(State.MANUAL_REVIEW, f"{said}: the read failed, nothing is proven")
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return Verdict(State.MANUAL_REVIEW, f"{said}: the answer is not JSON")
    items = dig(doc, spec.items) if spec.items else doc
    if not isinstance(items, list):
        return Verdict(State.MANUAL_REVIEW, f"{said}: no list at {spec.items or 'the top level'} of the answer")
    try:
        wanted = [(field, render(value, receipt)) for field, value in spec.find]
    except ReconcileError as e:
        return Verdict(State.MANUAL_REVIEW, f"{said}: {e}")
    for item in items:
        if all(_text(dig(item, field)) == value for field, value in wanted):
            found = _text(dig(item, spec.external_id)) if spec.external_id else None
            return Verdict(State.SUCCEEDED, f"{said}: found among {len(items)} items"
                           + (f" ({spec.external_id}={found})" if found else ""), found)
    return _absent(spec, f"{said}: not found among {len(items)} items")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _absent(spec: ReconcileSpec, said: str) -> Verdict:
    if spec.absence_provable and spec.retry_when_absent:
        return Verdict(State.SAFE_TO_RETRY, f"{said}; absence is proven and the rule allows a retry")
    why = "the rule does not say this read proves absence" if not spec.absence_provable else "the rule does not allow a retry"
    return Verdict(State.MANUAL_REVIEW, f"{said}; {why}")


def finish(store: Store, receipt: Receipt, verdict: Verdict, *, actor: str) -> Receipt:
    fields = {"external_id": verdict.external_id} if verdict.external_id else {}
    return store.transition(receipt.operation_id, verdict.state, reason=verdict.reason, actor=actor,
                            expect=[State.RECONCILING], **fields)


def reconcile(store: Store, op: Operation | None, operation_id: str, credentials: Mapping[str, str], *,
              actor: str, timeout: float = 30.0, verify: Any = True) -> Receipt:
    """Claim, read, judge and record, synchronously (the CLI's path)."""
    receipt = store.claim_for_reconcile(operation_id, actor=actor)
    if op is None or op.reconcile is None:
        what = "its rule is gone" if op is None else f"{op.api} {op.name} has no reconcile spec"
        return finish(store, receipt, Verdict(State.MANUAL_REVIEW, f"no read can decide: {what}"), actor=actor)
    try:
        read = plan_read(op, receipt)
        status, body = perform_read(read, credentials, timeout=timeout, verify=verify)
    except (ReconcileError, httpx.HTTPError) as e:
        return finish(store, receipt, Verdict(State.MANUAL_REVIEW, f"read failed: {describe(e)}"), actor=actor)
    except BaseException as e:  # never leave a receipt in reconciling
        finish(store, receipt, Verdict(State.MANUAL_REVIEW, f"read failed: {type(e).__name__}"), actor=actor)
        raise
    return finish(store, receipt, judge(op.reconcile, read, receipt, status, body), actor=actor)


def describe(e: Exception) -> str:
    """An error for the receipt's history. A local protocol error can quote our own headers
    (credentials included), so only its type is kept."""
    if isinstance(e, httpx.LocalProtocolError):
        return f"{type(e).__name__}: the request could not be sent as built"
    return str(e) or type(e).__name__
