"""
Resolve an unknown outcome with a read, never another write: one path for the proxy and the CLI.

    result = await reconcile(calls, op, receipt, credentials, settings=ReadSettings(...),
                             actor="cli:alice", reason="reconciling with a read")

The proxy awaits it when a duplicate arrives or an answer says the effect may exist, at most
`receipts_reads_max` reads at once (the gate's `slot`); the CLI runs it with `asyncio.run`, one
receipt after the other. One call, every branch:
1. claim: outcome_unknown/manual_review → reconciling (only one claimant wins; the others
   get IllegalTransition);
2. decide without a read when a read is not needed or not possible: the API deduplicates by
   the receipt's idempotency key and still remembers it → safe_to_retry; no rule, or no
   `reconcile:` spec → manual_review;
3. otherwise plan the read, send it (same TLS and upstream proxy as forwarding), judge it; a
   read with `pages:` is walked page by page, at most `pages.max`: found on any page → succeeded,
   "not found" proves absence only at the list's end, and a walk cut by `max` is a failed read;
4. record the verdict: reconciling → its state, with the evidence in the history.

Whatever fails on the way (a timeout, a TLS error, 429, 5xx, an answer that cannot be judged,
a bug) is recorded as a failed read: the receipt never stays `reconciling`. A failed read
proves nothing, so the receipt goes back to where it was: `outcome_unknown`, with the failure,
the count of failed reads and the time before which no new read is tried in its history
(`failed_reads`, `next_read_at`): the answer's Retry-After (seconds or an HTTP-date, at least
a second), else `settings.backoff` (30 s) doubling after each failed read, at most an hour.
It goes to `manual_review` only when `settings.attempts` reads have failed (3), or when a read
fails after `settings.deadline` (24 h) since the outcome became unknown, or when the next read
could only come after that deadline. A receipt that was in `manual_review` stays there. A read
that cannot be made for this receipt at all (a template with no value, a refused read) goes to
`manual_review` at once.

While a receipt waits out `next_read_at`, the proxy does not read for its duplicates
(`reconcilable_now`): they get 409 with Retry-After (`retry_after`); `receipts reconcile`
skips it unless told `--now`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from proxy_addon.errors import ReconcileError
from proxy_addon.reconcile.http_reads import ReadSettings, describe, perform_read, plan_read
from proxy_addon.reconcile.judge import Verdict, absent, failed, judge, unreadable
from proxy_addon.rules import Operation
from proxy_addon.states import State
from proxy_addon.store import Receipt, ReceiptStore, iso

logger = logging.getLogger(__name__)
T = TypeVar("T")
StoreCalls = Callable[[Callable[[ReceiptStore], T]], Awaitable[T]]  # runs a function of the store where the store lives


@dataclass(frozen=True)
class Reconciled:
    receipt: Receipt  # after the verdict was recorded
    verdict: Verdict
    read: bool = True  # a read was sent (False: decided without one: the idempotency key, no read configured)


def key_dedupes(op: Operation, receipt: Receipt, now: dt.datetime) -> bool:
    """Whether sending again with the receipt's key is safe: the API deduplicates by the header
    and still remembers the key (`idempotency_key.ttl`, counted from when the key was first
    sent, by this receipt or the first one of the retries that reused it)."""
    if not op.idempotency_header or not receipt.idempotency_key:
        return False
    if receipt.fingerprint_scheme is None and receipt.client_key is not None:
        # Made before the receipt's key replaced the agent's own (fingerprint schemes came with
        # it): the agent's key went upstream, and the key recorded never did.
        return False
    if not op.idempotency_ttl:
        return True
    first = dt.datetime.fromisoformat(receipt.idempotency_key_at or receipt.submitted_at)
    return now < first + dt.timedelta(seconds=op.idempotency_ttl)


MAX_BACKOFF = 3600.0  # seconds: the longest wait the doubling backoff reaches (unless `backoff` is longer)


def read_not_before(receipt: Receipt, now: dt.datetime) -> dt.datetime | None:
    """When an outcome_unknown receipt's next read may run, if that is still ahead: a failed read's
    Retry-After or backoff, or a read that proves absence only later (the original may still land,
    its `settle` delay: reconcile/judge.py)."""
    if receipt.state is not State.OUTCOME_UNKNOWN or not receipt.next_read_at:
        return None
    at = dt.datetime.fromisoformat(receipt.next_read_at)
    return at if at > now else None


def retry_after(op: Operation | None, receipt: Receipt, now: dt.datetime) -> dt.datetime | None:
    """
    When the next reconcile of an outcome_unknown receipt may read, if that is still ahead: the
    409's Retry-After for a duplicate, and when `receipts reconcile` reads it again without
    `--now`. None when a reconcile now would not read (no read configured; the API deduplicates
    by the receipt's key).
    """
    if op is None or op.reconcile is None or key_dedupes(op, receipt, now):
        return None
    return read_not_before(receipt, now)


def reconcilable_now(op: Operation, receipt: Receipt, now: dt.datetime) -> bool:
    """
    Whether a duplicate should reconcile an outcome_unknown receipt now: the API deduplicates
    by its key, or a read is configured and the receipt is not waiting out its next-read time
    (a failed read's Retry-After or backoff; a read that cannot prove absence before `settle`).
    """
    if key_dedupes(op, receipt, now):
        return True
    return op.reconcile is not None and retry_after(op, receipt, now) is None


def unknown_since(receipt: Receipt) -> dt.datetime:
    """When the outcome became unknown: the attempt's completion."""
    return dt.datetime.fromisoformat(receipt.completed_at or receipt.submitted_at)


def backoff(settings: ReadSettings, failures: int) -> float:
    """Seconds to wait after the `failures`-th failed read: `backoff`, doubling, at most an hour."""
    return min(settings.backoff * 2 ** min(failures - 1, 20), max(settings.backoff, MAX_BACKOFF))


def after_failed_read(
    verdict: Verdict, receipt: Receipt, was: State | None, settings: ReadSettings, now: dt.datetime
) -> Verdict:
    """
    What a failed read (an outcome_unknown verdict with `failed`) leaves the receipt as: still
    outcome_unknown until its next read (Retry-After, else the backoff), or manual_review when
    enough reads have failed, when the deadline has passed or the next read would come after
    it, or when the receipt was already in manual review. `receipt`: as claimed (its
    `failed_reads` does not yet count this read).
    """
    n = receipt.failed_reads + 1
    said = f"{verdict.reason}; failed read {n} of {settings.attempts}"
    if was is State.MANUAL_REVIEW:
        return Verdict(
            State.MANUAL_REVIEW, f"{verdict.reason}; failed read {n}: it stays in manual review", failed=True
        )
    since = unknown_since(receipt)
    deadline = since + dt.timedelta(seconds=settings.deadline)
    given = verdict.retry_after is not None
    wait = verdict.retry_after if given else now + dt.timedelta(seconds=backoff(settings, n))
    assert wait is not None
    wait = max(wait, now + dt.timedelta(seconds=1))  # Retry-After: 0 (or a past date) still waits a second
    if n >= settings.attempts:
        return Verdict(State.MANUAL_REVIEW, f"{said}: manual review", failed=True)
    if now >= deadline:
        return Verdict(
            State.MANUAL_REVIEW,
            f"{said}, and the outcome has been unknown since {iso(since)}, more than {settings.deadline:g}s: "
            "manual review",
            failed=True,
        )
    if wait > deadline:
        return Verdict(
            State.MANUAL_REVIEW,
            f"{said}, and the next read (not before {iso(wait)}{', as Retry-After says' if given else ''}) "
            f"would come after the deadline, {iso(deadline)}: manual review",
            failed=True,
        )
    why = "as Retry-After says" if given else "backoff"
    return Verdict(
        State.OUTCOME_UNKNOWN, f"{said}: next read not before {iso(wait)} ({why})", retry_after=wait, failed=True
    )


async def reconcile(
    calls: StoreCalls,
    op: Operation | None,
    receipt: Receipt | str,
    credentials: Mapping[str, str],
    *,
    settings: ReadSettings,
    actor: str,
    reason: str = "reconciling with a read",
    evidence: bool = False,
    slot: contextlib.AbstractAsyncContextManager[Any] | None = None,
) -> Reconciled:
    """
    Claim, decide (with a read where one is needed), record. `evidence`: the API answered that
    the effect may already exist, so only a read decides, even where resending with the same
    idempotency key would otherwise be safe. Raises IllegalTransition when the receipt cannot be
    claimed (another process is reconciling it, or it is settled already).

    `slot`: the proxy's bound on reads at once (gate/admission.py, receipts_reads_max). It is entered
    before the claim and left as soon as the decision is made, before the verdict is recorded:
    a receipt waiting for a slot stays as it was (outcome_unknown, free for the CLI or another
    process to settle meanwhile), and is `reconciling` only while its read runs. Whatever the
    slot raises on entry (no slot in time) propagates with nothing claimed. The CLI passes none:
    it runs its reads one at a time.
    """
    operation_id = receipt if isinstance(receipt, str) else receipt.operation_id
    cancelled: asyncio.CancelledError | None = None
    async with slot if slot is not None else contextlib.nullcontext():
        claimed, was = await calls(lambda s: _claim(s, operation_id, actor, reason))
        read = False
        try:
            verdict = _without_read(op, claimed, await calls(lambda s: s.clock()), evidence)
            if verdict is None:
                read = True
                verdict = await _read(op, claimed, credentials, settings, calls)
        except asyncio.CancelledError as e:
            cancelled = e
            verdict = failed("reconcile interrupted: the proxy stopped waiting for the read")
        except Exception as e:  # never leave a receipt in reconciling
            logger.exception("receipt %s: reconcile failed", claimed.operation_id)
            verdict = failed(f"reconcile failed: {describe(e)}")
    done, verdict = await _finish(calls, claimed, was, verdict, settings, actor)
    if cancelled is not None:
        raise cancelled
    return Reconciled(done, verdict, read)


def _claim(store: ReceiptStore, operation_id: str, actor: str, reason: str) -> tuple[Receipt, State | None]:
    """Claim the receipt; with the state it was claimed from (the claim's own event, the newest to reconciling)."""
    claimed = store.claim_for_reconcile(operation_id, actor=actor, reason=reason)
    claims = [e for e in store.events(operation_id) if e.event == "transition" and e.to_state is State.RECONCILING]
    return claimed, claims[-1].from_state if claims else None


def _without_read(op: Operation | None, receipt: Receipt, now: dt.datetime, evidence: bool) -> Verdict | None:
    """The verdict when no read is needed or possible (the API's idempotency key, no read configured); else None."""
    if op is None:
        return Verdict(State.MANUAL_REVIEW, "no read can decide: its rule is gone")
    if key_dedupes(op, receipt, now) and not evidence:
        return Verdict(
            State.SAFE_TO_RETRY,
            f"the API deduplicates by {op.idempotency_header}; "
            f"sending again with the same key {receipt.idempotency_key} is safe",
        )
    if op.reconcile is None:
        if op.idempotency_header and receipt.idempotency_key and not evidence:
            return Verdict(
                State.MANUAL_REVIEW,
                f"the API forgets {op.idempotency_header} keys after {op.idempotency_ttl}s and no read is configured",
            )
        return Verdict(State.MANUAL_REVIEW, f"no read can decide: {op.api} {op.name} has no reconcile spec")
    return None


async def _read(
    op: Operation | None, receipt: Receipt, credentials: Mapping[str, str], settings: ReadSettings, calls: StoreCalls
) -> Verdict:
    """Plan the read, send it (page by page), judge it."""
    assert op is not None and op.reconcile is not None  # _without_read decided the others
    try:
        read = plan_read(op, receipt)
    except ReconcileError as e:  # a template with no value in this receipt: no read will ever be made
        return unreadable(f"read failed: {e}")
    spec = op.reconcile
    most = spec.pages.max if spec.pages is not None else 1
    for page in range(1, most + 1):  # a read's pages: found on any → succeeded; absent only at the list's end
        try:
            status, headers, body = await perform_read(read, credentials, settings)
        except ReconcileError as e:  # refused: not a read
            return unreadable(f"read {read.method} {read.shown} failed: {e}")
        except httpx.HTTPError as e:
            return failed(f"read {read.method} {read.shown} failed: {describe(e)}")
        now = await calls(lambda s: s.clock())  # when the answer came: its Retry-After counts from here
        verdict = judge(spec, read, receipt, status, body, headers=headers, now=now, page=page)
        if verdict.next_read is None:
            return verdict
        read = verdict.next_read
    cut = f"{verdict.reason}, past pages.max ({most} pages): a walk cut short proves nothing"
    return failed(cut) if spec.absence_provable else absent(spec, cut)


async def _finish(
    calls: StoreCalls, receipt: Receipt, was: State | None, verdict: Verdict, settings: ReadSettings, actor: str
) -> tuple[Receipt, Verdict]:
    """Record the verdict (a failed read as `after_failed_read` says); the receipt after it, and the verdict."""

    def record(store: ReceiptStore) -> tuple[Receipt, Verdict]:
        v = verdict
        fields: dict[str, Any] = {"external_id": v.external_id} if v.external_id else {}
        if v.failed:
            fields["failed_reads"] = receipt.failed_reads + 1
            if v.state is State.OUTCOME_UNKNOWN:
                v = after_failed_read(v, receipt, was, settings, store.clock())
        # Only an outcome_unknown receipt waits for its next read (a failed read's, or settle's).
        fields["next_read_at"] = iso(v.retry_after) if v.state is State.OUTCOME_UNKNOWN and v.retry_after else None
        done = store.transition(
            receipt.operation_id, v.state, reason=v.reason, actor=actor, expect=[State.RECONCILING], **fields
        )
        return done, v

    return await calls(record)
