"""
The gate: what happens to a matched write between "it arrived" and "its outcome is recorded".

    gate = Gate(StoreThread(store), GateSettings(replay_window=86400, wait_submitted=30))
    admitted = await gate.admit(build_attempt, op, credentials)   # forward, or the answer for a duplicate
    ...send it once...
    receipt = await gate.record(operation_id, outcome, flow_id=flow.id, op=op, credentials=credentials)

`admit` owns the sequence admit → wait for an in-flight original → reconcile → decide again:
1. the store decides in one committed transaction: a new receipt to forward, or a duplicate
   of an existing one;
2. a duplicate of a receipt still `submitted` waits for its outcome (up to `wait_submitted`),
   on this process's own event or by polling the store when another process sent it; but one
   whose MCP call waits for its client's input is answered at once, and one whose call's task
   has not ended reads the task first (`read_task`, with the duplicate's credentials: an ended
   task settles the receipt, outcome/task_ends.py; store/rounds.py says what waits);
3. a duplicate of an `outcome_unknown` receipt that can be settled now is reconciled with a
   read, with the duplicate's own credentials; concurrent duplicates share one read. One that
   waits out its next-read time (a failed read's Retry-After or backoff, a settle delay:
   `reconcilable_now`) is not read for: the duplicate gets 409 with Retry-After;
4. the store decides again, and only this final answer is recorded in the receipt's events.

`record` writes the outcome (guarded: only from `submitted`), wakes the duplicates that wait
for it, and reconciles at once when the answer says the effect may already exist. An interim
answer (an MCP call's input_required, a task handle) is recorded as such: the receipt waits.
`task_seen` takes what a task's answer passing the proxy says (mitm/task_watch.py).

On SQLite the gate has `local`, a connection of the event loop's own that never waits
(mitm/receipts_db.py; gate/loop_connection.py): a duplicate is decided and its answer recorded
there, from one read, without a hand-off, and an outcome too while the store's thread is idle. Whatever it cannot do at
once (a new receipt, which is durable; another writer holding the lock or having written
since its read) goes to the store's thread, which decides as always. PostgreSQL has no
`local`: the fleet's database decides, through the store's thread.

The gate counts in its `metrics` (gate/metrics.py) what only it sees: each duplicate's final answer,
the duplicates that wait, how long a new receipt took to commit, and each reconcile read's result.

Reads at once are bounded (`reads_max`, receipts_reads_max): every reconcile read takes a slot
first (reconcile/read_slots.py); `reads_in_progress()` counts the reads waiting for a slot too, and a
stopping proxy waits for them.
Nothing here imports mitmproxy: the tests drive the gate directly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from proxy_addon.errors import IllegalTransition, ReconcileError, StoreError, StoreUnavailable
from proxy_addon.gate.loop_connection import OnTheLoop
from proxy_addon.gate.metrics import Metrics, read_result
from proxy_addon.gate.store_thread import StoreThread
from proxy_addon.intent.earlier_fingerprints import Versions
from proxy_addon.intent.fingerprint import SCHEME
from proxy_addon.outcome.classify import Outcome
from proxy_addon.outcome.task_ends import TaskReport, task_outcome
from proxy_addon.reconcile.http_reads import ReadSettings, perform_task_read
from proxy_addon.reconcile.read_slots import NoReadSlot, ReadSlots
from proxy_addon.reconcile.settle import reconcilable_now, reconcile
from proxy_addon.rules import Operation, PathTemplate, RuleSet
from proxy_addon.states import State
from proxy_addon.store import Attempt, Decision, Held, Receipt, ReceiptStore

if TYPE_CHECKING:  # imported only when OpenTelemetry is on (mitm/tracing.py)
    from proxy_addon.gate.receipt_spans import ReceiptSpans

logger = logging.getLogger(__name__)
T = TypeVar("T")

RECORD_RETRY = 10.0  # seconds an outcome's write is retried after a lost connection (PostgreSQL)
REMOTE_POLL = 5.0  # seconds between two reads of another process's receipt while LISTEN/NOTIFY wakes us


@dataclass(frozen=True)
class GateSettings:
    replay_window: float = 86400.0  # seconds after success during which a duplicate gets the recorded answer
    wait_submitted: float = 30.0  # seconds a duplicate of an in-flight request waits for its outcome
    reads: ReadSettings = field(default_factory=ReadSettings)
    reads_max: int = 8  # reconcile reads running at once in this process; the others wait (receipts_reads_max)
    # seconds an MCP call whose server asked for input waits for its client's next round (receipts_mcp_input_wait)
    mcp_input_wait: float = 600.0


@dataclass(frozen=True)
class Admitted:
    decision: Decision
    attempt: Attempt


def _new_receipt(decision: Decision, a: Attempt) -> bool:
    """A receipt this attempt made (not the next round of an MCP call, which goes on under its first one's)."""
    return decision.kind == "forward" and decision.receipt.flow_id == a.flow_id


def _held_versions(rules: RuleSet) -> Callable[[ReceiptStore], list[Held]]:
    described = {op.rule_digest: json.dumps(op.fingerprint_rule(), sort_keys=True) for op in rules.operations}

    def run(store: ReceiptStore) -> list[Held]:
        store.remember_rules(described)
        return store.fingerprint_versions()

    return run


class Gate:
    def __init__(
        self,
        calls: StoreThread,
        settings: GateSettings | None = None,
        *,
        post_reads: Callable[[str], tuple[PathTemplate, ...]] = lambda api: (),
        on_change: Callable[[Receipt], None] = lambda receipt: None,
        metrics: Metrics | None = None,
        local: ReceiptStore | None = None,
    ):
        self.calls = calls
        # A connection of the event loop's own that never waits (SQLite in WAL, lock_timeout=0):
        # duplicates are answered on it without a hand-off to the store's thread (gate/loop_connection.py).
        self._here = OnTheLoop(calls, local)
        self.settings = settings or GateSettings()
        self.metrics = metrics or Metrics()  # duplicates, waits, commit times, reads (gate/metrics.py)
        # OpenTelemetry (receipts_otel): each reconcile read is a span under the request it runs for; None: off.
        self.spans: ReceiptSpans | None = None
        self.post_reads = post_reads
        self.on_change = on_change  # a receipt changed here outside a flow's own hooks (a reconcile)
        self._outcomes: dict[str, asyncio.Event] = {}  # receipt id → set when its outcome is recorded
        self._reconciles: dict[str, asyncio.Task[Receipt | None]] = {}  # receipt id → the read in progress
        self._task_reads: dict[str, asyncio.Task[Receipt]] = {}  # receipt id → the read of its task in progress
        self._slots = ReadSlots(lambda: self.settings.reads_max)  # at most reads_max reads at once
        self._remote: dict[str, asyncio.Event] = {}  # receipt id → set when another process changed it (wake)
        self._waiters: collections.Counter[str] = collections.Counter()  # receipt id → duplicates waiting on it
        # Whether a listener (PostgreSQL's LISTEN) is calling `wake` now: polling then only backs it up.
        self.listening: Callable[[], bool] = lambda: False
        # The earlier fingerprint versions whose receipts can still answer a retry (intent/earlier_fingerprints.py).
        self.versions = Versions()

    def load_versions(self, rules: RuleSet) -> Versions:
        """
        At each rules load, before a write is admitted under them: keep the rules' descriptions in
        the store, and learn which earlier versions its receipts hold. Blocks on the store's thread.
        """
        return self._versions(rules, self.calls.wait(_held_versions(rules)))

    async def refresh_versions(self, rules: RuleSet) -> Versions:
        """`load_versions` off the event loop, now and then: receipts resolve, and another proxy may add some."""
        return self._versions(rules, await self.calls(_held_versions(rules)))

    def _versions(self, rules: RuleSet, held: list[Held]) -> Versions:
        self.versions = Versions.of(
            held, rules.operation, now=self._now(), replay_window=self.settings.replay_window, current=SCHEME
        )
        return self.versions

    def _now(self) -> Any:
        return self.calls.store.clock()

    def _follows_up(self, op: Operation, d: Decision) -> bool:
        """
        A duplicate that first waits for the original's outcome (in flight), reads its task (a
        task the proxy can read: store/rounds.py), or reconciles it. One whose original waits for
        its client's input is answered at once: its outcome comes only when that client goes on.
        """
        state, waiting = d.receipt.state, d.receipt.waiting_for
        return d.kind == "blocked" and (
            (state is State.SUBMITTED and waiting is None and self.settings.wait_submitted > 0)
            or (state is State.SUBMITTED and waiting == "task" and d.task_id is not None)
            or (state is State.OUTCOME_UNKNOWN and reconcilable_now(op, d.receipt, self._now()))
        )

    async def admit(
        self, attempt: Attempt | Callable[[], Attempt], op: Operation, credentials: Mapping[str, str]
    ) -> Admitted:
        """
        Decide what to do with a matched write; StoreError when the store cannot decide (do not
        forward). An Attempt already built is first decided on the event loop (`_decide_here`);
        a callable one (a large body to fingerprint) is built on the store's thread.
        """
        built: list[Attempt] = [] if callable(attempt) else [attempt]
        # the request's trace (OpenTelemetry on): read here on the event loop, where its span is current
        trace_id = self.spans.trace_id() if self.spans is not None else None

        def decide(final: bool, durable: bool | None) -> Callable[[ReceiptStore], Decision]:
            def run(store: ReceiptStore) -> Decision:
                if not built:  # built once, on the store's thread (fingerprinting a large body)
                    built.append(attempt() if callable(attempt) else attempt)
                # Only the answer a duplicate finally gets is recorded.
                started = time.perf_counter()
                decision = store.begin_attempt(
                    built[0],
                    after_success=op.after_success,
                    replay_window=self.settings.replay_window,
                    record_duplicate=self._records_answer(op, final),
                    durable=durable,
                )
                if decision.kind == "forward":
                    self.metrics.committed(op.api, op.name, time.perf_counter() - started, trace_id)
                return decision

            return run

        async def decided(final: bool) -> Decision:
            here = self._decide_here(built[0], op, final) if built else "busy"
            if isinstance(here, Decision):
                return here
            return await self.calls(decide(final, True if here == "new" else None))

        decision = await decided(False)
        if self._follows_up(op, decision):
            receipt = decision.receipt
            if receipt.state is State.SUBMITTED and receipt.waiting_for == "task" and decision.task_id is not None:
                receipt = await self.read_task(op, receipt, decision.task_id, credentials)
            elif receipt.state is State.SUBMITTED:
                self.metrics.waited(op.api, op.name)
                await self.wait_for_outcome(receipt.operation_id, self.settings.wait_submitted)
                receipt = await self.calls(lambda s: s.get(receipt.operation_id))
            if receipt.state is State.OUTCOME_UNKNOWN and reconcilable_now(op, receipt, self._now()):
                await self.reconcile(op, receipt, credentials, reason="a duplicate arrived: reconciling with a read")
            decision = await decided(True)
        if decision.kind == "forward":
            self._outcomes[decision.receipt.operation_id] = asyncio.Event()
        elif decision.kind != "denied":  # a `deny` decision's receipt is new: no duplicate
            self.metrics.duplicate(op.api, op.name, decision.kind)
        a = built[0]
        if a.decided is not None and (decision.kind == "denied" or _new_receipt(decision, a)):
            self.metrics.ruled(op.api, op.name, a.decided)
        return Admitted(decision, a)

    def _records_answer(self, op: Operation, final: bool) -> bool | Callable[[Decision], bool]:
        """Whether a duplicate's answer is recorded now: only the one it finally gets (not one that follows up)."""
        return True if final else (lambda d: not self._follows_up(op, d))

    @property
    def local(self) -> ReceiptStore | None:
        """The event loop's own connection (None: PostgreSQL, or closed): mitm/receipts_db.py sets it."""
        return self._here.local

    @local.setter
    def local(self, local: ReceiptStore | None) -> None:
        self._here.local = local

    def _decide_here(self, attempt: Attempt, op: Operation, final: bool) -> Decision | Literal["new", "busy"]:
        """A duplicate answered on `local` (gate/loop_connection.py); "busy" when there is none (PostgreSQL)."""
        return self._here.decide(
            attempt,
            after_success=op.after_success,
            replay_window=self.settings.replay_window,
            record_duplicate=self._records_answer(op, final),
        )

    async def record(
        self,
        operation_id: str,
        outcome: Outcome,
        *,
        flow_id: str | None = None,
        op: Operation | None = None,
        credentials: Mapping[str, str] | None = None,
    ) -> Receipt | None:
        """
        Record a forwarded write's outcome; the receipt, or None when the store refused (it stays
        submitted, and becomes outcome_unknown when the proxy restarts). An `evidence` outcome
        (the answer says the effect may exist) is reconciled at once with the request's credentials.
        An interim answer (`outcome.interim`: its server asked for input, or runs it as a task) is
        no outcome: the receipt stays submitted, waiting for it (store/rounds.py).
        """
        if outcome.interim is not None:
            return await self._record_interim(operation_id, outcome, flow_id)
        receipt = await self._recorded(operation_id, outcome, flow_id)
        if receipt is None:
            return None
        if outcome.evidence and op is not None:
            settled = await self.reconcile(
                op,
                receipt,
                credentials or {},
                evidence=True,
                reason="the answer says it may already exist: reconciling with a read",
            )
            receipt = settled if settled is not None else await self.calls(lambda s: s.get(operation_id))
        return receipt

    async def _recorded(self, operation_id: str, outcome: Outcome, flow_id: str | None) -> Receipt | None:
        """
        The outcome recorded and logged; None when the store refused (logged). Either way the
        duplicates waiting for it decide again.
        """
        try:
            receipt = await self._record(operation_id, outcome, flow_id)
        except IllegalTransition as e:  # no longer submitted: another proxy took it over (its lease expired)
            logger.warning(
                "receipt %s: could not record %s (%s): the receipt was moved on meanwhile: %s",
                operation_id,
                outcome.state,
                outcome.reason,
                e,
            )
            return None
        except StoreError as e:
            logger.error(
                "receipt %s: could not record %s (%s): %s; it stays submitted and becomes "
                "outcome_unknown when the proxy restarts",
                operation_id,
                outcome.state,
                outcome.reason,
                e,
            )
            return None
        finally:
            if (event := self._outcomes.pop(operation_id, None)) is not None:
                event.set()  # duplicates waiting for this outcome decide again
        level = logging.INFO if receipt.state is State.SUCCEEDED else logging.WARNING
        logger.log(
            level,
            "receipt %s %s %s %s %s: %s (%s)",
            receipt.operation_id,
            receipt.api,
            receipt.operation,
            receipt.method,
            receipt.target,
            receipt.state,
            outcome.reason,
        )
        return receipt

    async def _record_interim(self, operation_id: str, outcome: Outcome, flow_id: str | None) -> Receipt | None:
        """An interim answer, recorded: the receipt waits (store/rounds.py); its waiting duplicates look again."""
        interim = outcome.interim
        assert interim is not None
        wait = self.settings.mcp_input_wait
        try:
            receipt = await self.calls(
                lambda s: s.record_interim(operation_id, interim, flow_id=flow_id, input_wait=wait)
            )
        except (IllegalTransition, StoreError) as e:
            logger.warning("receipt %s: could not record that %s: %s", operation_id, interim.reason, e)
            return None
        finally:
            if (event := self._outcomes.pop(operation_id, None)) is not None:
                event.set()  # duplicates waiting for an outcome decide again: it now waits for its client or task
        logger.info(
            "receipt %s %s %s: submitted, waiting for %s: %s",
            receipt.operation_id,
            receipt.api,
            receipt.operation,
            receipt.waiting_for,
            interim.reason if interim.kind == "input_required" else f"task {receipt.task_hint}: {interim.reason}",
        )
        return receipt

    def read_task(
        self, op: Operation, receipt: Receipt, task_id: str, credentials: Mapping[str, str]
    ) -> asyncio.Future[Receipt]:
        """
        Read the task a receipt waits for (reconcile/task_reads.py), with a duplicate's own credentials,
        and settle the receipt if the task has ended (outcome/task_ends.py); concurrent duplicates share one
        read, which takes a read slot. The receipt after the read (as it was, when the read failed).
        """
        task = self._task_reads.get(receipt.operation_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._read_task(op, receipt, task_id, dict(credentials)))
            self._task_reads[receipt.operation_id] = task
            task.add_done_callback(lambda _: self._task_reads.pop(receipt.operation_id, None))
        return asyncio.shield(task)

    async def _read_task(self, op: Operation, receipt: Receipt, task_id: str, credentials: dict[str, str]) -> Receipt:
        settings = self.settings.reads
        try:
            async with self._slots.hold(receipt, settings.timeout):
                report = await perform_task_read(receipt.target, task_id, receipt.task_revision, credentials, settings)
        except (NoReadSlot, ReconcileError) as e:
            past = receipt.waiting_until is not None and self._now() >= dt.datetime.fromisoformat(receipt.waiting_until)
            if isinstance(e, ReconcileError) and past:  # its server may have discarded it: its end may never be read
                expired = TaskReport(None, expired=str(e), said="the proxy's tasks/get")
                return await self.task_report(op, receipt, expired, credentials)
            logger.warning(
                "receipt %s %s %s: task %s not read: %s; it waits on",
                receipt.operation_id,
                receipt.api,
                receipt.operation,
                receipt.task_hint,
                e,
            )
            return receipt
        return await self.task_report(op, receipt, report, credentials)

    async def task_seen(
        self, api: str, task_id: str, report: TaskReport, operation: Callable[[Receipt], Operation | None]
    ) -> Receipt | None:
        """
        An answer about a task that passed the proxy (a client's tasks/get or tasks/result:
        mitm/task_watch.py): the receipt of `api` waiting for that task, if any, after it (None: none).
        """
        receipt = await self.calls(lambda s: s.waiting_task(api, task_id))
        op = operation(receipt) if receipt is not None else None
        if receipt is None or op is None:
            return None
        return await self.task_report(op, receipt, report)

    async def task_report(
        self, op: Operation, receipt: Receipt, report: TaskReport, credentials: Mapping[str, str] | None = None
    ) -> Receipt:
        """What a report says of the task a receipt waits for: its outcome recorded once it ended, else its status."""
        hint = receipt.task_hint or "?"
        outcome = task_outcome(report, op, receipt.task_revision, hint)
        operation_id = receipt.operation_id
        if outcome is None:
            status = report.status
            if status is not None and status != receipt.task_status:
                why = f"task {hint} is {status} ({report.said})"
                await self.calls(lambda s: s.note_task(operation_id, status, why))
                return await self.calls(lambda s: s.get(operation_id))
            return receipt
        # Recorded as any outcome; one that says the effect may exist (a classify rule) is read at once
        # with the duplicate's credentials, when a duplicate brought them (an observed answer did not).
        done = await self.record(
            operation_id, outcome, op=op if credentials is not None else None, credentials=credentials
        )
        if done is None:  # settled meanwhile (another read, another proxy), or the store refused: logged
            return await self.calls(lambda s: s.get(operation_id))
        self.on_change(done)
        return done

    async def _record(self, operation_id: str, outcome: Outcome, flow_id: str | None) -> Receipt:
        """
        The outcome's transition. On a store that reconnects (PostgreSQL), a write that failed
        for want of the database (a lost connection) is tried again for up to RECORD_RETRY
        seconds; a retry that finds the outcome already recorded (the lost answer was to a
        commit that happened) takes it. Failing that, the receipt stays submitted, and the
        lease's expiry, or a restart, makes it outcome_unknown.
        """
        if (here := self._here.record(operation_id, outcome, flow_id)) is not None:
            return here
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (RECORD_RETRY if getattr(self.calls.store, "reconnects", False) else 0)
        delay, retried = 0.1, False
        while True:
            try:
                return await self.calls(
                    lambda s: s.record_outcome(
                        operation_id, outcome.state, reason=outcome.reason, flow_id=flow_id, **outcome.fields()
                    )
                )
            except IllegalTransition:
                if retried:
                    receipt = await self.calls(lambda s: s.get(operation_id))
                    if receipt.state is outcome.state:
                        return receipt
                raise
            except StoreUnavailable as e:
                if loop.time() + delay > deadline:
                    raise
                logger.warning("receipt %s: recording %s failed (%s); trying again", operation_id, outcome.state, e)
                await asyncio.sleep(delay)
                delay, retried = min(delay * 2, 1.0), True

    def wake(self, operation_id: str) -> None:
        """Another process changed this receipt (PostgreSQL's NOTIFY): its waiting duplicates look again."""
        event = self._remote.pop(operation_id, None)
        if event is not None:
            event.set()

    async def wait_for_outcome(self, operation_id: str, timeout: float) -> None:
        """
        Wait, without holding a thread, until a submitted receipt has an outcome or `timeout`
        passes: on this process's own event, or, when another proxy process sent the original,
        until `wake` says it changed (LISTEN/NOTIFY on PostgreSQL), backed by polling the store
        (every REMOTE_POLL seconds while a listener is connected, else every 0.2 s).
        """
        event = self._outcomes.get(operation_id)
        if event is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._waiters[operation_id] += 1
        try:
            while loop.time() < deadline:
                woken = self._remote.setdefault(operation_id, asyncio.Event())  # before the read: no wake is missed
                poll = REMOTE_POLL if self.listening() else 0.2
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), min(poll, max(0.0, deadline - loop.time())))
                receipt = await self.calls(lambda s: s.get(operation_id))
                if receipt.state is not State.SUBMITTED or receipt.waiting_for is not None:
                    return  # an outcome, or an interim answer: it waits for its client or its task, not in flight
        finally:
            self._waiters[operation_id] -= 1
            if not self._waiters[operation_id]:
                del self._waiters[operation_id]
                self._remote.pop(operation_id, None)

    def reads_in_progress(self) -> int:
        """
        Reconcile reads running now (a duplicate's, an operator's), and those waiting for a read
        slot: a stopping proxy waits for them (drain.py).
        """
        return len(self._reconciles) + len(self._task_reads)

    def reconcile(
        self,
        op: Operation,
        receipt: Receipt,
        credentials: Mapping[str, str],
        *,
        reason: str,
        actor: str = "proxy (inline reconcile)",
        evidence: bool = False,
    ) -> asyncio.Future[Receipt | None]:
        """
        Resolve an outcome_unknown receipt with a read, with the given (a duplicate's own)
        credentials; nothing is stored of them. Concurrent callers in this process share one
        read; in other processes, the store's guarded claim lets only one of them read. The
        receipt after the read, or None when another process claimed it first.
        """
        task = self._reconciles.get(receipt.operation_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._reconcile(op, receipt, dict(credentials), reason, actor, evidence)
            )
            self._reconciles[receipt.operation_id] = task
            task.add_done_callback(lambda _: self._reconciles.pop(receipt.operation_id, None))
        return asyncio.shield(task)

    async def _reconcile(
        self, op: Operation, receipt: Receipt, credentials: dict[str, str], reason: str, actor: str, evidence: bool
    ) -> Receipt | None:
        """`_settle`, in a span of its own while OpenTelemetry is on: under the request it runs for, linked
        to the span that made the receipt (the task that runs it carries the request's context)."""
        if self.spans is None:
            return await self._settle(op, receipt, credentials, reason, actor, evidence)
        attributes = {
            "receipt.id": receipt.operation_id,
            "receipt.api": receipt.api,
            "receipt.operation": receipt.operation,
            "receipt.reconcile.why": reason,
        }
        with self.spans.child("receipt.reconcile", attributes, link=receipt.trace_parent) as span:
            done = await self._settle(op, receipt, credentials, reason, actor, evidence)
            if done is None:  # another process claimed it, or no read slot in time: nothing recorded here
                span.set_attribute("receipt.reconcile.settled", False)
            else:
                span.set_attributes({"receipt.reconcile.settled": True, "receipt.state": str(done.state)})
            return done

    async def _settle(
        self, op: Operation, receipt: Receipt, credentials: dict[str, str], reason: str, actor: str, evidence: bool
    ) -> Receipt | None:
        settings = dataclasses.replace(self.settings.reads, post_reads=self.post_reads(op.api))
        try:
            result = await reconcile(
                self.calls,
                op,
                receipt,
                credentials,
                settings=settings,
                actor=actor,
                reason=reason,
                evidence=evidence,
                # An operation with no read configured is decided without one (by its key, or manual_review).
                slot=self._slots.hold(receipt, settings.timeout) if op.reconcile is not None else None,
            )
        except IllegalTransition:
            return None  # another proxy process claimed it first
        except NoReadSlot as e:
            self.metrics.read(op.api, op.name, "no_slot")
            logger.warning(
                "receipt %s %s %s: not read: %s; it stays %s, nothing recorded",
                receipt.operation_id,
                receipt.api,
                receipt.operation,
                e,
                receipt.state,
            )
            return None
        done = result.receipt
        if result.read:
            self.metrics.read(op.api, op.name, read_result(result.verdict))
        logger.warning(
            "receipt %s %s %s: %s (%s)", done.operation_id, done.api, done.operation, done.state, result.verdict.reason
        )
        self.on_change(done)
        return done
