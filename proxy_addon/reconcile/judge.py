"""
What a reconcile read proves: found, absent (and whether that is proof), or nothing.

    verdict = judge(op.reconcile, read, receipt, status, body, headers=headers, now=now)

- the effect was found → succeeded (with the found item's external id);
- absence is proven and the rule allows a retry → safe_to_retry;
- absent, but the original request may still land (its proxy went silent while it was in
  flight: `landed_by`), or the read proves absence only after `settle` → outcome_unknown until
  then (`absence_provable_from`: a read proves absence only after the original request can no
  longer land);
- absent but not provable → manual_review, with the reason. It is never guessed;
- a read that failed (a non-2xx answer, an answer that cannot be judged) → a failed verdict:
  outcome_unknown, with the answer's Retry-After if it has one. It proves nothing, so it
  changes nothing; reconcile/settle.py decides when the next read may run and when enough reads
  have failed for the receipt to go to manual_review;
- not found on a page whose list goes on: with `pages:` declared, a verdict that names the next
  page's read (`next_read`; reconcile/settle.py walks up to `pages.max` pages); without, or when the next
  page cannot be asked for, a failed verdict (manual_review for a read that never proves
  absence): a list cut short proves nothing;
- a read that can never be made or judged for this receipt (a template with no value in it)
  → manual_review at once, as a failed verdict.
A `find` value is compared as text, and a number by its value (`1` is `1.0`, `100` is `1e2`),
as the fingerprint compares numbers (intent_body.canonical_number).
"""

from __future__ import annotations

import datetime as dt
import email.utils
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from proxy_addon.errors import ReconcileError
from proxy_addon.outcome.classify import external_id_of, rule_fits
from proxy_addon.reconcile.http_reads import ReadRequest, render
from proxy_addon.reconcile.pages import next_page
from proxy_addon.rules import TEMPLATE_VAR, ReconcileSpec
from proxy_addon.states import State
from proxy_addon.store import Receipt, iso, utcnow
from proxy_addon.wire.jsonpath import NOT_JSON, dig, id_in, parse_json, text_of


@dataclass(frozen=True)
class Verdict:
    state: State
    reason: str
    external_id: str | None = None
    # outcome_unknown until then: absence is not provable yet (settle); for a failed read, the
    # answer's Retry-After (judge), then the time before which no new read is tried (reconcile)
    retry_after: dt.datetime | None = None
    failed: bool = False  # the read failed or its answer could not be judged: nothing was learned
    next_read: ReadRequest | None = None  # not found on this page; the list continues with this read


def failed(reason: str, retry_after: dt.datetime | None = None) -> Verdict:
    """A read that proves nothing: the outcome is as unknown as before (reconcile/settle.py says what next)."""
    return Verdict(State.OUTCOME_UNKNOWN, reason, retry_after=retry_after, failed=True)


def unreadable(reason: str) -> Verdict:
    """A read that cannot be made or judged for this receipt however often it is tried: a human decides."""
    return Verdict(State.MANUAL_REVIEW, reason, failed=True)


_MAX_RETRY_AFTER = 10**8  # seconds (three years): a larger Retry-After is taken as this, never overflows


def retry_after_of(headers: Mapping[str, str] | None, now: dt.datetime) -> dt.datetime | None:
    """
    When an answer's `Retry-After` (RFC 9110 §10.2.3: delay-seconds or an HTTP-date) allows the
    next request, or None when it has none or it cannot be parsed. Header names are lower-case.
    """
    value = (headers or {}).get("retry-after", "").strip()
    if not value:
        return None
    if re.fullmatch(r"[0-9]+", value):
        return now + dt.timedelta(seconds=min(int(value), _MAX_RETRY_AFTER))
    try:
        at = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)  # an HTTP-date is GMT


def judge(
    spec: ReconcileSpec,
    read: ReadRequest,
    receipt: Receipt,
    status: int,
    body: bytes,
    *,
    headers: Mapping[str, str] | None = None,
    now: dt.datetime | None = None,
    page: int = 1,
) -> Verdict:
    """What the read (its `page`-th page) proves."""
    said = f"read {read.method} {read.shown} → HTTP {status}" + (f" (page {page})" if page > 1 else "")
    now = now or utcnow()
    wait = retry_after_of(headers, now)  # a failed read's answer may say when to ask again (429, 503)
    if spec.absent_when is not None and rule_fits(spec.absent_when, status, headers or {}, body):
        return absent(spec, f"{said}: the answer says there is no such object", receipt, now)
    if not spec.find and not spec.bounds:
        return _by_status(spec, said, receipt, status, body, now, wait)
    if not 200 <= status < 300:
        return failed(f"{said}: the read failed, nothing is proven", wait)
    doc = parse_json(body)
    if doc is NOT_JSON:
        return failed(f"{said}: the answer is not JSON", wait)
    items = dig(doc, spec.items) if spec.items else doc
    if isinstance(items, dict):  # a read of one object (GraphQL `issue(id:)`): a list of one
        items = [items]
    if not isinstance(items, list):
        return failed(f"{said}: no list at {spec.items or 'the top level'} of the answer", wait)
    try:
        wanted = [(f, render(value, receipt)) for f, value in spec.find]
        bounds = [(f, kind, _number(render(value, receipt))) for f, kind, value in spec.bounds]
    except ReconcileError as e:  # the receipt has no value for a template: no read will ever judge it
        return unreadable(f"{said}: {e}")
    for item in items:
        if all(_same(dig(item, f), value) for f, value in wanted) and all(
            _within(dig(item, f), kind, bound) for f, kind, bound in bounds
        ):
            found = _found_id(item, spec.external_id, receipt) if spec.external_id else None
            label = spec.external_id if isinstance(spec.external_id, str) else ":".join(spec.external_id or ())
            return Verdict(
                State.SUCCEEDED,
                f"{said}: found among {len(items)} items" + (f" ({label}={found})" if found else ""),
                found,
            )
    said = f"{said}: not found among {len(items)} items"
    more = next_page(spec, read, doc, headers or {})
    if isinstance(more, ReadRequest):
        return Verdict(State.OUTCOME_UNKNOWN, f"{said}; the list goes on", next_read=more)
    if more is not None and spec.absence_provable:  # a list cut short: as a failed read
        return failed(f"{said}, but {more}: nothing is proven", wait)
    if more is not None:  # the read never proves absence: a human decides, as for any "not found"
        return absent(spec, f"{said}, and {more}", receipt, now)
    return absent(spec, said, receipt, now)


def _by_status(
    spec: ReconcileSpec,
    said: str,
    receipt: Receipt,
    status: int,
    body: bytes,
    now: dt.datetime,
    wait: dt.datetime | None,
) -> Verdict:
    """A read without `find`: 2xx → found, 404/410 → absent (unless `absent_when` says how absence looks)."""
    if 200 <= status < 300 and (spec.absent_when is None or _has(body, spec.items)):
        return Verdict(State.SUCCEEDED, f"{said}: found", external_id_of(body, spec.external_id) or receipt.external_id)
    if status in (404, 410) and spec.absent_when is None:
        return absent(spec, said, receipt, now)
    return failed(f"{said}: the read failed, nothing is proven", wait)


def _found_id(item: Any, fields: str | tuple[str, ...], receipt: Receipt) -> str | None:
    """The found item's id: its fields, with any `{template}` part taken from the receipt
    (Slack's history items carry `ts` but not the channel: `["{intent.channel}", ts]`)."""
    if isinstance(fields, str):
        return id_in(item, fields)
    parts = []
    for f in fields:
        part = render(f, receipt) if TEMPLATE_VAR.fullmatch(f) else id_in(item, f)
        if part is None:
            return None
        parts.append(part)
    return ":".join(parts)


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def _same(found: Any, wanted: str) -> bool:
    """
    Whether a read's value is the one a `find` template rendered: as text, or a number by its
    value (the intent holds `1` for a write sent as `1.0`, an API may answer `1.0`, or `100` for `1e2`).
    """
    if text_of(found) == wanted:
        return True
    if isinstance(found, bool) or not isinstance(found, (int, float)) or not _JSON_NUMBER.fullmatch(wanted):
        return False
    return Decimal(found if isinstance(found, int) else repr(found)) == Decimal(wanted)


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


def _has(body: bytes, items: str | None) -> bool:
    """Whether a 2xx answer holds an object at `items` (absent_when reads: a null there proves nothing)."""
    doc = parse_json(body)
    if doc is NOT_JSON:
        return False
    return (dig(doc, items) if items else doc) not in (None, [], {})


def absent(spec: ReconcileSpec, said: str, receipt: Receipt | None = None, now: dt.datetime | None = None) -> Verdict:
    """The verdict when the read did not find the effect: proof, proof later (lifetime, settle), or nothing."""
    if spec.absence_provable and receipt is not None:
        proof_from = absence_provable_from(spec, receipt)
        if (now or utcnow()) < proof_from:
            return Verdict(State.OUTCOME_UNKNOWN, f"{said}; {_not_yet(spec, receipt)}", retry_after=proof_from)
    if spec.absence_provable and spec.retry_when_absent:
        return Verdict(State.SAFE_TO_RETRY, f"{said}; absence is proven and the rule allows a retry")
    why = (
        "the rule does not say this read proves absence"
        if not spec.absence_provable
        else "the rule does not allow a retry"
    )
    return Verdict(State.MANUAL_REVIEW, f"{said}; {why}")


# Seconds added to the lifetime of a request whose proxy went silent: the skew between that
# proxy's clock (which wrote `in_flight_until`) and the reader's, and the closing of its connection.
LANDING_MARGIN = 2.0
# receipts_upstream_timeout's default: the lifetime of a receipt recorded before receipts had one.
UPSTREAM_TIMEOUT = 300


def landed_by(receipt: Receipt) -> dt.datetime:
    """
    When the original request can no longer land: when its proxy saw the attempt end
    (`completed_at`: the answer, a failure, its deadline; the connection closed then). A proxy
    that went silent (its receipt recovered: stopped, paused, cut off) never saw it end: its
    request may be held open until its `in_flight_until` (when it became submitted, or when its
    MCP call's last round was sent: store/rounds.py, plus that proxy's upstream timeout; an
    earlier version's receipt: submitted_at plus UPSTREAM_TIMEOUT), plus LANDING_MARGIN. An
    upstream that goes on with a request after its connection closed is what a rule's `settle`
    is for (counted from here).
    """
    if receipt.completed_at:
        return dt.datetime.fromisoformat(receipt.completed_at)
    if receipt.in_flight_until:
        until = dt.datetime.fromisoformat(receipt.in_flight_until)
    else:
        until = dt.datetime.fromisoformat(receipt.submitted_at) + dt.timedelta(seconds=UPSTREAM_TIMEOUT)
    return until + dt.timedelta(seconds=LANDING_MARGIN)


def absence_provable_from(spec: ReconcileSpec, receipt: Receipt) -> dt.datetime:
    """When a read may prove absence: `settle` after the original request can no longer land (`landed_by`)."""
    return landed_by(receipt) + dt.timedelta(seconds=spec.settle or 0)


def _not_yet(spec: ReconcileSpec, receipt: Receipt) -> str:
    """Why a read that found nothing proves nothing yet, and when it may."""
    proof_from = iso(absence_provable_from(spec, receipt))
    if receipt.completed_at:
        after = f"{spec.settle}s after the outcome became unknown"
        return f"this read proves absence only {after}: try again after {proof_from}"
    timeout = f"{receipt.upstream_timeout:g}s" if receipt.upstream_timeout is not None else "unrecorded"
    settle = f", and {spec.settle}s more (settle)" if spec.settle else ""
    return (
        f"the original request may still land until {iso(landed_by(receipt))} (its proxy went silent while it was "
        f"in flight; its upstream timeout: {timeout}, plus {LANDING_MARGIN:g}s{settle}): try again after {proof_from}"
    )
