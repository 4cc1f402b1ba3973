"""
Resolve an unknown outcome with a read, never another write: one path for the proxy and the CLI.

    result = await reconcile(calls, op, receipt, credentials, settings=ReadSettings(...),
                             actor="cli:alice", reason="reconciling with a read")

The proxy awaits it when a duplicate arrives or an answer says the effect may exist; the CLI
runs it with `asyncio.run`. One call, every branch:
1. claim: outcome_unknown/manual_review → reconciling (only one claimant wins; the others
   get IllegalTransition);
2. decide without a read when a read is not needed or not possible: the API deduplicates by
   the receipt's idempotency key and still remembers it → safe_to_retry; no rule, or no
   `reconcile:` spec → manual_review;
3. otherwise plan the read, send it (same TLS and upstream proxy as forwarding), judge it;
4. record the verdict: reconciling → its state, with the evidence in the history.

Whatever fails on the way (a template with no value, a refused read, a timeout, an answer
that cannot be judged, a bug) is recorded as a failed read: the receipt never stays
`reconciling`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from proxy_addon.errors import ReconcileError
from proxy_addon.judge import Verdict, absence_provable_from, failed, judge
from proxy_addon.reads import ReadSettings, describe, perform_read, plan_read
from proxy_addon.rules import Operation
from proxy_addon.states import State
from proxy_addon.store import Receipt, Store

logger = logging.getLogger(__name__)
T = TypeVar("T")
StoreCalls = Callable[[Callable[[Store], T]], Awaitable[T]]  # runs a function of the store where the store lives


@dataclass(frozen=True)
class Reconciled:
    receipt: Receipt  # after the verdict was recorded
    verdict: Verdict


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
    at = absence_provable_from(spec, receipt)
    return at if at > now else None


def reconcilable_now(op: Operation, receipt: Receipt, now: dt.datetime) -> bool:
    """
    Whether a duplicate should reconcile an outcome_unknown receipt now: the API deduplicates
    by its key, or a read is configured, and a read that cannot prove absence yet (settle)
    has not looked since the outcome became unknown (then it waits until it can).
    """
    if key_dedupes(op, receipt, now):
        return True
    if op.reconcile is None:
        return False
    return retry_after(op, receipt, now) is None or receipt.updated_at == receipt.completed_at


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
) -> Reconciled:
    """
    Claim, decide (with a read where one is needed), record. `evidence`: the API answered that
    the effect may already exist, so only a read decides, even where resending with the same
    idempotency key would otherwise be safe. Raises IllegalTransition when the receipt cannot be
    claimed (another process is reconciling it, or it is settled already).
    """
    operation_id = receipt if isinstance(receipt, str) else receipt.operation_id
    claimed = await calls(lambda s: s.claim_for_reconcile(operation_id, actor=actor, reason=reason))
    try:
        verdict = await _decide(op, claimed, credentials, settings, evidence, calls)
    except asyncio.CancelledError:
        await _finish(calls, claimed, failed("reconcile interrupted: the proxy stopped waiting for the read"), actor)
        raise
    except Exception as e:  # never leave a receipt in reconciling
        logger.exception("receipt %s: reconcile failed", claimed.operation_id)
        verdict = failed(f"reconcile failed: {describe(e)}")
    done = await _finish(calls, claimed, verdict, actor)
    return Reconciled(done, verdict)


async def _decide(
    op: Operation | None,
    receipt: Receipt,
    credentials: Mapping[str, str],
    settings: ReadSettings,
    evidence: bool,
    calls: StoreCalls,
) -> Verdict:
    now = await calls(lambda s: s.clock())
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
    try:
        read = plan_read(op, receipt)
    except ReconcileError as e:
        return failed(f"read failed: {e}")
    try:
        status, headers, body = await perform_read(read, credentials, settings)
    except (ReconcileError, httpx.HTTPError) as e:
        return failed(f"read {read.method} {read.shown} failed: {describe(e)}")
    return judge(op.reconcile, read, receipt, status, body, headers=headers, now=now)


async def _finish(calls: StoreCalls, receipt: Receipt, verdict: Verdict, actor: str) -> Receipt:
    fields: dict[str, Any] = {"external_id": verdict.external_id} if verdict.external_id else {}
    return await calls(
        lambda s: s.transition(
            receipt.operation_id,
            verdict.state,
            reason=verdict.reason,
            actor=actor,
            expect=[State.RECONCILING],
            **fields,
        )
    )
