"""
Resolve an unknown outcome with a read, never another write.

    receipt = store.claim_for_reconcile(id, actor="cli")      # outcome_unknown → reconciling
    read = plan_read(op, receipt)                              # GET/HEAD from the rule's template
    status, headers, body = perform_read(read, credentials)
    verdict = judge(op.reconcile, read, receipt, status, body, headers=headers)
    store.transition(id, verdict.state, reason=verdict.reason, expect=[State.RECONCILING], ...)

`reconcile()` does the four steps for the CLI; the addon runs the same steps around an
async read. The verdict:
- the effect was found → succeeded (with the found item's external id);
- absence is proven by the read and the rule allows a retry → safe_to_retry;
- anything else (absent but not provable, no reconcile spec, a read that failed) →
  manual_review, with the reason. It is never guessed.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urljoin

import httpx

from proxy_addon import gql
from proxy_addon.classify import external_id_of, id_in, rule_fits
from proxy_addon.errors import ReconcileError
from proxy_addon.fingerprint import dig
from proxy_addon.redaction import credentials_from as _credentials, redact_url
from proxy_addon.rules import _TEMPLATE_VAR, Operation, PathTemplate, ReconcileSpec
from proxy_addon.states import State
from proxy_addon.store import Receipt, Store, iso, utcnow

READ_METHODS = ("GET", "HEAD")


@dataclass(frozen=True)
class ReadRequest:
    method: str
    url: str
    body: bytes | None = None  # a POST read's JSON body (only to a path the rules list in post_reads)
    headers: tuple[tuple[str, str], ...] = ()  # the rule's own headers (Notion-Version), never credentials

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
    retry_after: dt.datetime | None = None  # outcome_unknown until then: absence is not provable yet


def _variables(receipt: Receipt) -> dict[str, Any]:
    intent = receipt.intent
    out: dict[str, Any] = {"external_id": receipt.external_id, "idempotency_key": receipt.idempotency_key}
    if receipt.submitted_at:
        # When the first attempt that may have made this effect was sent: a retry that reuses
        # an idempotency key continues its first attempt. Whole seconds, rounded down, so
        # that a `created >= ` filter never misses an object made in the same second.
        submitted = dt.datetime.fromisoformat(receipt.idempotency_key_at or receipt.submitted_at)
        out.update(submitted_at=submitted.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ"),
                   submitted_at_unix=int(submitted.timestamp()))
    out.update({f"path.{k}": v for k, v in intent.get("path", {}).items()})
    out.update({f"query.{k}": v for k, v in intent.get("query", {}).items()})
    out.update({f"header.{k}": v for k, v in intent.get("headers", {}).items()})
    out.update({f"intent.{k}": v for k, v in (intent.get("body") or intent.get("form") or intent.get("multipart") or {}).items()})
    return out


def _value(values: Mapping[str, Any], name: str, receipt: Receipt) -> Any:
    value = values.get(name)
    if value is None:
        raise ReconcileError(f"{{{name}}} has no value in receipt {receipt.operation_id}")
    return value


def render(template: str, receipt: Receipt, *, url: bool = False) -> str:
    """Fill `{intent.x}`, `{path.x}`, `{query.x}`, `{header.x}`, `{external_id}`, `{idempotency_key}`,
    `{submitted_at}` and `{submitted_at_unix}` from the receipt."""
    values = _variables(receipt)

    def one(m) -> str:
        value = _value(values, m.group(1), receipt)
        text = value if isinstance(value, str) else json.dumps(value)
        return quote(text, safe="") if url else text

    return _TEMPLATE_VAR.sub(one, template)


def plan_read(op: Operation, receipt: Receipt) -> ReadRequest:
    spec = op.reconcile
    if spec is None:
        raise ReconcileError(f"operation {op.api} {op.name} has no reconcile spec")
    url = urljoin(receipt.target, render(spec.url, receipt, url=True))
    body = None
    if spec.body is not None:
        doc = {k: v if k == "query" else _render_doc(v, receipt) for k, v in spec.body.items()}
        body = json.dumps(doc).encode()
    headers = tuple((name, render(value, receipt)) for name, value in spec.headers)
    return ReadRequest(spec.method, url, body, headers)


def _render_doc(doc: Any, receipt: Receipt) -> Any:
    """A POST read's body with its string templates filled (a GraphQL `query` is sent as written).
    A string that is one whole template (`"{submitted_at_unix}"`) takes the value's own JSON type."""
    if isinstance(doc, dict):
        return {k: _render_doc(v, receipt) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_render_doc(v, receipt) for v in doc]
    if isinstance(doc, str):
        whole = _TEMPLATE_VAR.fullmatch(doc)
        return _value(_variables(receipt), whole.group(1), receipt) if whole else render(doc, receipt)
    return doc


def credentials_from(op: Operation, headers: Mapping[str, str]) -> dict[str, str]:
    """The credential headers of a request (lower-case names): the rule's, Authorization, Cookie."""
    return _credentials(op.credential_headers, headers)


def _check(read: ReadRequest, post_reads: Sequence[PathTemplate]) -> None:
    """Refuse anything but a read: GET or HEAD, or a POST of a query to a path the rules list in post_reads."""
    if read.method in READ_METHODS and read.body is None:
        return
    path = httpx.URL(read.url).path
    if read.method == "POST" and read.body is not None and any(t.match(path) is not None for t in post_reads):
        request = gql.request_of(read.body)
        why = gql.read_is_query(request[0]) if request else None
        if why is None:
            return
        raise ReconcileError(f"refusing POST {read.shown}: {why}")
    raise ReconcileError(f"refusing {read.method} {read.shown}: a reconcile read is GET or HEAD "
                         "(or a POST to a path the rules list in post_reads), never a write")


def _request_args(read: ReadRequest, credentials: Mapping[str, str]) -> dict[str, Any]:
    headers = {**dict(read.headers), **credentials}
    if read.body is not None:
        headers["content-type"] = "application/json"
    return {"headers": headers, "content": read.body}


def perform_read(read: ReadRequest, credentials: Mapping[str, str], *, timeout: float = 30.0,
                 verify: Any = True, post_reads: Sequence[PathTemplate] = ()) -> tuple[int, dict[str, str], bytes]:
    """Send a read; its status, headers (lower-case names) and body."""
    _check(read, post_reads)
    with httpx.Client(timeout=timeout, verify=verify, trust_env=False, follow_redirects=True) as client:
        r = client.request(read.method, read.url, **_request_args(read, credentials))
        return r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content


async def perform_read_async(read: ReadRequest, credentials: Mapping[str, str], *, timeout: float = 30.0,
                             verify: Any = True, post_reads: Sequence[PathTemplate] = ()) -> tuple[int, dict[str, str], bytes]:
    _check(read, post_reads)
    async with httpx.AsyncClient(timeout=timeout, verify=verify, trust_env=False, follow_redirects=True) as client:
        r = await client.request(read.method, read.url, **_request_args(read, credentials))
        return r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content


def judge(spec: ReconcileSpec, read: ReadRequest, receipt: Receipt, status: int, body: bytes, *,
          headers: Mapping[str, str] | None = None, now: dt.datetime | None = None) -> Verdict:
    """What the read proves."""
    said = f"read {read.method} {read.shown} → HTTP {status}"
    now = now or utcnow()
    if spec.absent_when is not None and rule_fits(spec.absent_when, status, headers or {}, body):
        return _absent(spec, f"{said}: the answer says there is no such object", receipt, now)
    if not spec.find and not spec.bounds:
        if 200 <= status < 300 and (spec.absent_when is None or _has(body, spec.items)):
            return Verdict(State.SUCCEEDED, f"{said}: found", external_id_of(body, spec.external_id) or receipt.external_id)
        if status in (404, 410) and spec.absent_when is None:
            return _absent(spec, said, receipt, now)
        return Verdict(State.MANUAL_REVIEW, f"{said}: the read failed, nothing is proven")
    if not 200 <= status < 300:
        return Verdict(State.MANUAL_REVIEW, f"{said}: the read failed, nothing is proven")
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return Verdict(State.MANUAL_REVIEW, f"{said}: the answer is not JSON")
    items = dig(doc, spec.items) if spec.items else doc
    if isinstance(items, dict):  # a read of one object (GraphQL `issue(id:)`): a list of one
        items = [items]
    if not isinstance(items, list):
        return Verdict(State.MANUAL_REVIEW, f"{said}: no list at {spec.items or 'the top level'} of the answer")
    try:
        wanted = [(field, render(value, receipt)) for field, value in spec.find]
        bounds = [(field, kind, _number(render(value, receipt))) for field, kind, value in spec.bounds]
    except ReconcileError as e:
        return Verdict(State.MANUAL_REVIEW, f"{said}: {e}")
    for item in items:
        if all(_text(dig(item, field)) == value for field, value in wanted) and all(
                _within(dig(item, field), kind, bound) for field, kind, bound in bounds):
            found = _found_id(item, spec.external_id, receipt) if spec.external_id else None
            label = spec.external_id if isinstance(spec.external_id, str) else ":".join(spec.external_id or ())
            return Verdict(State.SUCCEEDED, f"{said}: found among {len(items)} items"
                           + (f" ({label}={found})" if found else ""), found)
    return _absent(spec, f"{said}: not found among {len(items)} items", receipt, now)


def _found_id(item: Any, fields: str | tuple[str, ...], receipt: Receipt) -> str | None:
    """The found item's id: its fields, with any `{template}` part taken from the receipt
    (Slack's history items carry `ts` but not the channel: `["{intent.channel}", ts]`)."""
    if isinstance(fields, str):
        return id_in(item, fields)
    parts = []
    for f in fields:
        part = render(f, receipt) if _TEMPLATE_VAR.fullmatch(f) else id_in(item, f)
        if part is None:
            return None
        parts.append(part)
    return ":".join(parts)


def _number(value: Any) -> float | None:
    """A number, a numeric string, or an ISO 8601 time, as a number (seconds for times); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        try:
            return dt.datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def _within(value: Any, kind: str, bound: float | None) -> bool:
    """`find` bounds: an item whose field is missing or not comparable does not fit."""
    v = _number(value)
    if v is None or bound is None:
        return False
    return v >= bound if kind == "gte" else v <= bound


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _has(body: bytes, items: str | None) -> bool:
    """Whether a 2xx answer holds an object at `items` (absent_when reads: a null there proves nothing)."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return False
    return (dig(doc, items) if items else doc) not in (None, [], {})


def _absent(spec: ReconcileSpec, said: str, receipt: Receipt | None = None, now: dt.datetime | None = None) -> Verdict:
    if spec.absence_provable and spec.settle and receipt is not None:
        proof_from = _absence_provable_from(spec, receipt)
        if (now or utcnow()) < proof_from:
            return Verdict(State.OUTCOME_UNKNOWN,
                           f"{said}; this read proves absence only {spec.settle}s after the outcome became unknown: "
                           f"try again after {iso(proof_from)}", retry_after=proof_from)
    if spec.absence_provable and spec.retry_when_absent:
        return Verdict(State.SAFE_TO_RETRY, f"{said}; absence is proven and the rule allows a retry")
    why = "the rule does not say this read proves absence" if not spec.absence_provable else "the rule does not allow a retry"
    return Verdict(State.MANUAL_REVIEW, f"{said}; {why}")


def key_dedupes(op: Operation, receipt: Receipt, now: dt.datetime) -> bool:
    """Whether sending again with the receipt's key is safe: the API deduplicates by the header
    and still remembers the key (`idempotency_key.ttl`, counted from when the key was first
    sent, by this receipt or the first one of the retries that reused it)."""
    if not op.idempotency_header or not receipt.idempotency_key:
        return False
    if not op.idempotency_ttl:
        return True
    first = dt.datetime.fromisoformat(receipt.idempotency_key_at or receipt.submitted_at)
    return now < first + dt.timedelta(seconds=op.idempotency_ttl)


def retry_after(op: Operation | None, receipt: Receipt, now: dt.datetime) -> dt.datetime | None:
    """When a read can next prove absence of an outcome_unknown receipt's effect, if that is still ahead."""
    spec = op.reconcile if op is not None else None
    if spec is None or not spec.settle or receipt.state is not State.OUTCOME_UNKNOWN:
        return None
    at = _absence_provable_from(spec, receipt)
    return at if at > now else None


def _absence_provable_from(spec: ReconcileSpec, receipt: Receipt) -> dt.datetime:
    """`settle` after the outcome became unknown (the attempt's completion)."""
    return dt.datetime.fromisoformat(receipt.completed_at or receipt.submitted_at) + dt.timedelta(seconds=spec.settle)


def finish(store: Store, receipt: Receipt, verdict: Verdict, *, actor: str) -> Receipt:
    fields = {"external_id": verdict.external_id} if verdict.external_id else {}
    return store.transition(receipt.operation_id, verdict.state, reason=verdict.reason, actor=actor,
                            expect=[State.RECONCILING], **fields)


def reconcile(store: Store, op: Operation | None, operation_id: str, credentials: Mapping[str, str], *,
              actor: str, timeout: float = 30.0, verify: Any = True, post_reads: Sequence[PathTemplate] = ()) -> Receipt:
    """Claim, read, judge and record, synchronously (the CLI's path)."""
    receipt = store.claim_for_reconcile(operation_id, actor=actor)
    if op is None or op.reconcile is None:
        what = "its rule is gone" if op is None else f"{op.api} {op.name} has no reconcile spec"
        return finish(store, receipt, Verdict(State.MANUAL_REVIEW, f"no read can decide: {what}"), actor=actor)
    try:
        read = plan_read(op, receipt)
        status, headers, body = perform_read(read, credentials, timeout=timeout, verify=verify, post_reads=post_reads)
    except (ReconcileError, httpx.HTTPError) as e:
        return finish(store, receipt, Verdict(State.MANUAL_REVIEW, f"read failed: {describe(e)}"), actor=actor)
    except BaseException as e:  # never leave a receipt in reconciling
        finish(store, receipt, Verdict(State.MANUAL_REVIEW, f"read failed: {type(e).__name__}"), actor=actor)
        raise
    verdict = judge(op.reconcile, read, receipt, status, body, headers=headers, now=store.clock())
    return finish(store, receipt, verdict, actor=actor)


def describe(e: Exception) -> str:
    """An error for the receipt's history. A local protocol error can quote our own headers
    (credentials included), so only its type is kept."""
    if isinstance(e, httpx.LocalProtocolError):
        return f"{type(e).__name__}: the request could not be sent as built"
    return str(e) or type(e).__name__
