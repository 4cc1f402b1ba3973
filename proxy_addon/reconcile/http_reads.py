"""
Reconcile reads: plan one from a rule and a receipt, refuse anything that is not a read, send it.

    read = plan_read(op, receipt)            # GET/HEAD (or a POST query to a post_reads path)
    status, headers, body = await perform_read(read, credentials, settings)
    report = await perform_task_read(receipt.target, task_id, receipt.task_revision, credentials, settings)

Templates (`{intent.title}`, `{path.id}`, `{query.q}`, `{header.x}`, `{external_id}`,
`{idempotency_key}`, `{submitted_at}`, `{submitted_at_unix}`) are filled from the receipt,
never from anything it does not record. Reads verify TLS and use an upstream proxy exactly
as forwarding does (`Upstream`), and carry the credentials they are given, which are never stored.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote_plus, urljoin

import httpx

from proxy_addon.errors import ReconcileError
from proxy_addon.outcome.task_ends import TaskReport
from proxy_addon.reconcile.task_reads import read_task
from proxy_addon.reconcile.tool_reads import read_tool
from proxy_addon.rules import TEMPLATE_VAR, Operation, PathTemplate
from proxy_addon.store import Receipt
from proxy_addon.wire import gql
from proxy_addon.wire.mcp_calls import revision_of
from proxy_addon.wire.redaction import redact_url
from proxy_addon.wire.upstream import Upstream

READ_METHODS = ("GET", "HEAD")


@dataclass(frozen=True)
class ReadRequest:
    method: str
    url: str
    body: bytes | None = None  # a POST read's JSON body (only to a path the rules list in post_reads)
    headers: tuple[tuple[str, str], ...] = ()  # the rule's own headers (Notion-Version), never credentials
    # Query parameters whose values the rule's read.url writes (from the receipt or literally): shown.
    keep: tuple[str, ...] = field(default=(), compare=False)
    tool: str | None = None  # an MCP read (method "MCP"): this tool at `url`, `body` its arguments (JSON)
    tool_read_only: bool = False
    revision: str | None = None  # an MCP read: the protocol revision the write was sent in (its intent's note)

    @property
    def shown(self) -> str:
        """The URL as it may be stored and logged: the values the read template writes (`keep`), unless
        credential-looking; every other query value REDACTED (redaction.redact_url)."""
        u = httpx.URL(self.url)
        if self.tool is not None:
            return f"{redact_url(u.scheme, u.host, u.port or {'http': 80}.get(u.scheme, 443), u.path)} tool {self.tool}"
        port = u.port or {"http": 80, "https": 443}[u.scheme]
        return redact_url(u.scheme, u.host, port, u.raw_path.decode(), keep=self.keep)


@dataclass(frozen=True)
class ReadSettings:
    """
    How reads are sent: the same TLS and upstream proxy as forwarding, a timeout, and the POST
    paths that read; and what a failed read leads to (reconcile/settle.py): the receipt stays
    outcome_unknown and the next read waits (the answer's Retry-After, else `backoff` seconds
    doubling after each failed read, at most an hour), until `attempts` reads have failed or
    the outcome has been unknown for `deadline` seconds: then manual_review.
    """

    upstream: Upstream = field(default_factory=Upstream)
    timeout: float = 30.0
    post_reads: tuple[PathTemplate, ...] = ()
    attempts: int = 3  # failed reads before manual_review (receipts_read_attempts, --read-attempts)
    deadline: float = 86400.0  # seconds after the outcome became unknown (receipts_read_deadline, --read-deadline)
    backoff: float = 30.0  # seconds before the read after a first failure, doubling (receipts_read_backoff)


def _variables(receipt: Receipt) -> dict[str, Any]:
    intent = receipt.intent
    out: dict[str, Any] = {"external_id": receipt.external_id, "idempotency_key": receipt.idempotency_key}
    if receipt.submitted_at:
        # When the first attempt that may have made this effect was sent: a retry that reuses
        # an idempotency key continues its first attempt. Whole seconds, rounded down, so
        # that a `created >= ` filter never misses an object made in the same second.
        submitted = dt.datetime.fromisoformat(receipt.idempotency_key_at or receipt.submitted_at)
        out.update(
            submitted_at=submitted.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ"),
            submitted_at_unix=int(submitted.timestamp()),
        )
    out.update({f"path.{k}": v for k, v in intent.get("path", {}).items()})
    out.update({f"query.{k}": v for k, v in intent.get("query", {}).items()})
    out.update({f"header.{k}": v for k, v in intent.get("headers", {}).items()})
    body = intent.get("body") or intent.get("form") or intent.get("multipart") or {}
    # A field stored as a keyed hash of its object (intent/fingerprint.py), or of a value too large to store
    # (`bounded`: intent_body.bound_intent), has no value a read could use: a template naming it fails
    # to plan (a failed read), rather than look for the hash and prove absence.
    hashed = set(intent.get("hashed") or ())
    out.update({f"intent.{k}": v for k, v in body.items() if k not in hashed})
    for name in intent.get("bounded") or ():
        out.pop(name, None)
    return out


def value_of(name: str, receipt: Receipt, values: Mapping[str, Any] | None = None) -> Any:
    """A template variable's value in a receipt; ReconcileError when it has none."""
    value = (values if values is not None else _variables(receipt)).get(name)
    if value is None:
        raise ReconcileError(f"{{{name}}} has no value in receipt {receipt.operation_id}")
    return value


def render(template: str, receipt: Receipt, *, url: bool = False) -> str:
    """Fill a template's variables from the receipt (percent-encoded with `url`)."""
    values = _variables(receipt)

    def one(m: Any) -> str:
        value = value_of(m.group(1), receipt, values)
        text = value if isinstance(value, str) else json.dumps(value)
        return quote(text, safe="") if url else text

    return TEMPLATE_VAR.sub(one, template)


def plan_read(op: Operation, receipt: Receipt) -> ReadRequest:
    spec = op.reconcile
    if spec is None:
        raise ReconcileError(f"operation {op.api} {op.name} has no reconcile spec")
    if spec.tool is not None:  # an MCP read: the tool, on the endpoint the receipt's call went to
        arguments = json.dumps(_render_doc(spec.body or {}, receipt)).encode()
        return ReadRequest(
            "MCP",
            receipt.target,
            arguments,
            tool=spec.tool,
            tool_read_only=spec.tool_read_only,
            revision=revision_of(receipt.intent.get("mcp_revision")),
        )
    url = urljoin(receipt.target, render(spec.url, receipt, url=True))
    keep = tuple(unquote_plus(p.partition("=")[0]) for p in re.split("[&;]", spec.url.partition("?")[2]) if p)
    body = None
    if spec.body is not None:
        doc = {k: v if k == "query" else _render_doc(v, receipt) for k, v in spec.body.items()}
        body = json.dumps(doc).encode()
    headers = tuple((name, render(value, receipt)) for name, value in spec.headers)
    return ReadRequest(spec.method, url, body, headers, keep=keep)


def _render_doc(doc: Any, receipt: Receipt) -> Any:
    """A POST read's body with its string templates filled (a GraphQL `query` is sent as written).
    A string that is one whole template (`"{submitted_at_unix}"`) takes the value's own JSON type."""
    if isinstance(doc, dict):
        return {k: _render_doc(v, receipt) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_render_doc(v, receipt) for v in doc]
    if isinstance(doc, str):
        whole = TEMPLATE_VAR.fullmatch(doc)
        return value_of(whole.group(1), receipt) if whole else render(doc, receipt)
    return doc


def check_read(read: ReadRequest, post_reads: Sequence[PathTemplate]) -> None:
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
    raise ReconcileError(
        f"refusing {read.method} {read.shown}: a reconcile read is GET or HEAD "
        "(or a POST to a path the rules list in post_reads), never a write"
    )


async def perform_read(
    read: ReadRequest, credentials: Mapping[str, str], settings: ReadSettings | None = None
) -> tuple[int, dict[str, str], bytes]:
    """Send a read once; its status, headers (lower-case names) and body. httpx errors are the caller's."""
    settings = settings or ReadSettings()
    if read.tool is not None:
        async with settings.upstream.client(timeout=settings.timeout, follow_redirects=False) as client:
            arguments = json.loads(read.body or b"{}")
            return await read_tool(
                client,
                read.url,
                read.tool,
                arguments,
                credentials,
                declared_read_only=read.tool_read_only,
                revision=read.revision,
            )
    check_read(read, settings.post_reads)
    headers = {**dict(read.headers), **credentials}
    if read.body is not None:
        headers["content-type"] = "application/json"
    async with settings.upstream.client(timeout=settings.timeout, follow_redirects=True) as client:
        r = await client.request(read.method, read.url, headers=headers, content=read.body)
        return r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content


async def perform_task_read(
    url: str, task_id: str, revision: str | None, credentials: Mapping[str, str], settings: ReadSettings | None = None
) -> TaskReport:
    """The proxy's own read of an MCP task (task_reads.py), sent as reads are; ReconcileError when it fails."""
    settings = settings or ReadSettings()
    async with settings.upstream.client(timeout=settings.timeout, follow_redirects=False) as client:
        return await read_task(client, url, task_id, revision, credentials)


def describe(e: BaseException) -> str:
    """An error for the receipt's history. A local protocol error can quote our own headers
    (credentials included), so only its type is kept."""
    if isinstance(e, httpx.LocalProtocolError):
        return f"{type(e).__name__}: the request could not be sent as built"
    detail = str(e)
    return f"{type(e).__name__}: {detail}" if detail else type(e).__name__
