"""
The proxy's Prometheus metrics: what they are, and the helpers that record them.

    metrics = Metrics()                       # a registry of its own: nothing shared between instances
    store.observer = metrics.changed          # every state change the store commits
    metrics.duplicate(op.api, op.name, decision.kind)
    metrics.watch_db(path)                    # receipt_proxy_unknown_outcomes reads this database

Every name has the prefix `receipt_proxy_`; labels `api` and `operation` (the rule's names) unless said:

    transitions_total{from_state,to_state}   receipts' state changes this process committed;
                                             from_state="new": a new receipt
    duplicates_total{answer}                 duplicates answered from a receipt, nothing sent:
                                             blocked, blocked_succeeded, key_conflict, replayed
    duplicate_waits_total                    duplicates that waited for an original still in flight
    refused_total{reason}                    matched requests not sent, answered by the proxy before or
                                             without a receipt: store_unavailable (503), stopping (503),
                                             body_too_large (413), bad_encoding, bad_header,
                                             undecodable_header (400: a text header not UTF-8),
                                             unpaired_surrogate (400: a JSON "\\ud800" escape alone),
                                             method_override_refused (400; MCP refusals among them),
                                             ambiguous_target (400: a fragment, ;path parameters),
                                             bad_json (400: a JSON body servers read two ways),
                                             budget_uncountable (400: no number in the field a budget sums),
                                             over_budget (429: past a budget; its receipt rejected)
    unknown_outcomes{state} (gauge)          receipts in the database (every process's) whose outcome
                                             is not known: outcome_unknown, reconciling, manual_review;
                                             read at scrape time
    reconcile_reads_total{result}            this process's reads: found, absent, manual_review,
                                             settling, failed, no_slot (none free within the timeout)
    approvals_pending (gauge)                writes held for approval in this process now
    approval_decisions_total{decision}       approved, denied, timeout, modified, hung_up, rules_changed, stopped
    rule_decisions_total{decision}           new writes of an operation with `decisions:` (its own or its
                                             file's), by what they decided: allow, approve, deny
    approval_webhooks_total{result}          approval webhooks this process sent: sent (2xx), failed
    mode{mode} (gauge)                       (no api/operation) 1 for receipts_mode's value (enforce or
                                             observe), 0 for the other
    would_have_total{would}                  observe mode: writes sent that enforcement would have
                                             answered otherwise: would_block, would_replay, would_hold,
                                             would_deny (their receipts' events say the same)
    rules_reloads_total{result}              (no api/operation) rules loaded again while running: ok, failed
    rules_last_reload_successful (gauge)     (no api/operation) 0 while the last reload has failed
    receipt_commit_seconds (histogram)       deciding and committing a new receipt (one write
                                             transaction, its fsync included) before the request leaves
    upstream_seconds (histogram)             a forwarded write's exchange: sent → its outcome classified
                                             (both histograms: with OpenTelemetry on, each bucket's exemplar
                                             is the trace_id of a request it counted, shown to a scrape that
                                             asks for OpenMetrics: Accept: application/openmetrics-text)
    budget_used{budget,per} (gauge)          each budget's use in its current window (the database's, every
                                             process's), read at scrape time (gate/budget_gauges.py); per
                                             principal: the most any one principal used (no principal is a label)
    budget_limit{budget,per} (gauge)         each budget's limit (writes, or the summed field's most)

and prometheus_client's `process_*` (CPU, memory, open files) for the process.

Labels are names from the rules files and fixed words: never a credential, a receipt id, a
fingerprint, a URL or a body. A counter's series appears at its first event, except
`duplicates_total`, which starts at 0 for every operation of the rules (`known`).

Recording is cheap (a dict lookup of the labelled child, then an update; thread-safe): the store's observer runs
on the store's thread, the rest on the event loop. Only the unknown-outcomes gauge reads the
database: at scrape time, on the scraping thread, with a read connection of its own (one query
over the index on `state`), never through the proxy's store thread. Serving the registry over
HTTP is the mitmproxy layer's (mitm/metrics_server.py, option receipts_metrics).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric

from proxy_addon.errors import ReceiptsError
from proxy_addon.gate.budget_gauges import BudgetGauges
from proxy_addon.reconcile.judge import Verdict
from proxy_addon.rules import Operation
from proxy_addon.states import State
from proxy_addon.store import ReceiptStore, open_store

logger = logging.getLogger(__name__)
T = TypeVar("T")

PREFIX = "receipt_proxy_"
UNKNOWN = (State.OUTCOME_UNKNOWN, State.RECONCILING, State.MANUAL_REVIEW)  # an outcome not known (yet)
ANSWERS = {
    "blocked": "blocked",
    "blocked_succeeded": "blocked_succeeded",
    "key_conflict": "key_conflict",
    "replay": "replayed",
}  # the store's Decision.kind of a duplicate → the `answer` label
REFUSALS = (
    "store_unavailable",
    "stopping",
    "body_too_large",
    "bad_encoding",
    "bad_header",
    "undecodable_header",
    "unpaired_surrogate",
    "method_override_refused",
    "bad_json",
    "ambiguous_target",
    "budget_uncountable",
    "over_budget",
)  # a matched request the proxy answered instead of sending (flows.refuse's kinds) → the `reason` label
READ_RESULTS = {
    State.SUCCEEDED: "found",
    State.SAFE_TO_RETRY: "absent",
    State.MANUAL_REVIEW: "manual_review",
    State.OUTCOME_UNKNOWN: "settling",
}  # a read's verdict (not failed) → the `result` label
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
UPSTREAM_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
OP = ("api", "operation")


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its kind, its name (after PREFIX), its help, its labels, and a histogram's buckets."""

    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None


# The metrics, by the Metrics attribute that holds each (registered in this order).
METRICS: dict[str, MetricSpec] = {
    "transitions": MetricSpec(
        Counter,
        "transitions",
        "State changes of receipts committed by this process (from_state new: a new receipt)",
        (*OP, "from_state", "to_state"),
    ),
    "duplicates": MetricSpec(
        Counter, "duplicates", "Duplicates answered from an existing receipt, nothing sent upstream", (*OP, "answer")
    ),
    "waits": MetricSpec(
        Counter, "duplicate_waits", "Duplicates that waited for the outcome of an original still in flight", OP
    ),
    "refusals": MetricSpec(
        Counter,
        "refused",
        "Matched requests the proxy answered itself and never sent (no receipt written, 413, 400s)",
        (*OP, "reason"),
    ),
    "reads": MetricSpec(Counter, "reconcile_reads", "Reconcile reads run by this process, by result", (*OP, "result")),
    "pending": MetricSpec(Gauge, "approvals_pending", "Writes held for an operator's approval in this process", OP),
    "decisions": MetricSpec(Counter, "approval_decisions", "Decisions on writes held for approval", (*OP, "decision")),
    "verdicts": MetricSpec(
        Counter,
        "rule_decisions",
        "New writes decided by the rules' decisions: allow, approve (held), deny (not sent)",
        (*OP, "decision"),
    ),
    "webhooks": MetricSpec(
        Counter, "approval_webhooks", "Approval webhooks sent for held writes: sent (2xx) or failed", (*OP, "result")
    ),
    "mode": MetricSpec(Gauge, "mode", "1 for the receipts_mode the proxy runs in (enforce, observe)", ("mode",)),
    "would": MetricSpec(
        Counter,
        "would_have",
        "Observe mode: writes sent that enforcement would have blocked, replayed, held or denied",
        (*OP, "would"),
    ),
    "reloads": MetricSpec(
        Counter, "rules_reloads", "Rules loaded again while running (failed: the last good rules stay)", ("result",)
    ),
    "reload_ok": MetricSpec(
        Gauge, "rules_last_reload_successful", "1 if the last rules reload succeeded (or none was needed)"
    ),
    "commit": MetricSpec(
        Histogram,
        "receipt_commit_seconds",
        "Committing a new receipt (fsync included) before its request leaves",
        OP,
        COMMIT_BUCKETS,
    ),
    "upstream": MetricSpec(
        Histogram,
        "upstream_seconds",
        "A forwarded write's exchange with the upstream, until its outcome is known",
        OP,
        UPSTREAM_BUCKETS,
    ),
}


def declare(spec: MetricSpec, registry: CollectorRegistry) -> Any:
    """The metric `spec` declares, registered in `registry`."""
    if spec.buckets is not None:
        return Histogram(f"{PREFIX}{spec.name}", spec.help, spec.labels, buckets=spec.buckets, registry=registry)
    return spec.kind(f"{PREFIX}{spec.name}", spec.help, spec.labels, registry=registry)


class _Children:
    """
    A labelled metric's children, looked up by their label values once: prometheus_client's
    labels() checks and converts the values and takes a lock on every call (5 to 10 µs), a dict
    lookup does not. Thread-safe as dict reads and writes are; the set of label values is the
    rules' operations times fixed words, so it stays small.
    """

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self._cache: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._cache.get(values)
        if child is None:
            child = self._cache[values] = self.metric.labels(*values)
        return child


def exemplar(trace_id: str | None) -> dict[str, str] | None:
    """
    A histogram observation's exemplar: the trace id of the request it measured (32 hex digits),
    shown only to a scrape that asks for OpenMetrics (Accept: application/openmetrics-text); None
    (OpenTelemetry off, or outside a request's span): no exemplar.
    """
    return {"trace_id": trace_id} if trace_id else None


def read_result(verdict: Verdict) -> str:
    """The `result` label of a reconcile read's verdict."""
    return "failed" if verdict.failed else READ_RESULTS[verdict.state]


class Metrics:
    """One process's metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.transitions: Counter = declare(METRICS["transitions"], self.registry)
        self.duplicates: Counter = declare(METRICS["duplicates"], self.registry)
        self.waits: Counter = declare(METRICS["waits"], self.registry)
        self.refusals: Counter = declare(METRICS["refusals"], self.registry)
        self.reads: Counter = declare(METRICS["reads"], self.registry)
        self.pending: Gauge = declare(METRICS["pending"], self.registry)
        self.decisions: Counter = declare(METRICS["decisions"], self.registry)
        self.verdicts: Counter = declare(METRICS["verdicts"], self.registry)
        self.webhooks: Counter = declare(METRICS["webhooks"], self.registry)
        self.mode: Gauge = declare(METRICS["mode"], self.registry)
        self.would: Counter = declare(METRICS["would"], self.registry)
        self.reloads: Counter = declare(METRICS["reloads"], self.registry)
        self.reload_ok: Gauge = declare(METRICS["reload_ok"], self.registry)
        self.commit: Histogram = declare(METRICS["commit"], self.registry)
        self.upstream: Histogram = declare(METRICS["upstream"], self.registry)
        self.reload_ok.set(1)
        self.unknown = UnknownOutcomes()
        self.registry.register(self.unknown)
        self.budgets = BudgetGauges(self.unknown.read)
        self.registry.register(self.budgets)
        ProcessCollector(registry=self.registry)
        # The children the hot path updates: one dict lookup each (the rest are rare).
        self._transition = _Children(self.transitions)
        self._duplicate = _Children(self.duplicates)
        self._commit = _Children(self.commit)
        self._upstream = _Children(self.upstream)

    # --- recording (each a labels() lookup and an update) ----------------------------------

    def changed(self, api: str, operation: str, from_state: State | None, to_state: State) -> None:
        """The store's observer: a state change it committed."""
        self._transition(api, operation, from_state or "new", to_state).inc()

    def duplicate(self, api: str, operation: str, kind: str) -> None:
        """
        A duplicate's final answer (the store's Decision.kind: blocked, blocked_succeeded, key_conflict,
        replay); a new receipt refused (denied, over_budget) is no duplicate: counted as its refusal instead.
        """
        if kind in ANSWERS:
            self._duplicate(api, operation, ANSWERS[kind]).inc()

    def refused(self, api: str, operation: str, reason: str) -> None:
        """A matched request answered by the proxy and never sent (REFUSALS); other kinds are not counted here."""
        if reason in REFUSALS:
            self.refusals.labels(api, operation, reason).inc()

    def waited(self, api: str, operation: str) -> None:
        self.waits.labels(api, operation).inc()

    def read(self, api: str, operation: str, result: str) -> None:
        self.reads.labels(api, operation, result).inc()

    def held(self, api: str, operation: str, by: int) -> None:
        """A write held for approval (+1), or no longer held (-1)."""
        self.pending.labels(api, operation).inc(by)

    def decided(self, api: str, operation: str, decision: str) -> None:
        self.decisions.labels(api, operation, decision).inc()

    def ruled(self, api: str, operation: str, decision: str) -> None:
        """A new write the rules' `decisions:` decided (intent/decisions.py): allow, approve or deny."""
        self.verdicts.labels(api, operation, decision).inc()

    def notified(self, api: str, operation: str, *, ok: bool) -> None:
        """An approval webhook sent (a 2xx answer) or failed."""
        self.webhooks.labels(api, operation, "sent" if ok else "failed").inc()

    def in_mode(self, mode: str) -> None:
        """receipts_mode (enforce, observe): its series 1, the other's 0."""
        for each in ("enforce", "observe"):
            self.mode.labels(each).set(1 if each == mode else 0)

    def would_have(self, api: str, operation: str, kinds: Iterable[str]) -> None:
        """Observe mode: a write sent that enforcement would have answered otherwise (Decision.would)."""
        for kind in kinds:
            self.would.labels(api, operation, kind).inc()

    def reloaded(self, ok: bool) -> None:
        self.reloads.labels("ok" if ok else "failed").inc()
        self.reload_ok.set(1 if ok else 0)

    def committed(self, api: str, operation: str, seconds: float, trace_id: str | None = None) -> None:
        """A new receipt's commit time; `trace_id` (OpenTelemetry on): its request's trace, the bucket's exemplar."""
        self._commit(api, operation).observe(seconds, exemplar(trace_id))

    def exchanged(self, api: str, operation: str, seconds: float, trace_id: str | None = None) -> None:
        """A forwarded write's exchange time; `trace_id` (OpenTelemetry on): its request's trace, the exemplar."""
        self._upstream(api, operation).observe(seconds, exemplar(trace_id))

    # --- set up ----------------------------------------------------------------------------

    def known(self, operations: Iterable[Operation]) -> None:
        """
        The rules' operations: their duplicates counters start at 0, the unknown-outcomes gauge shows 0s,
        and the budget gauges show their budgets.
        """
        operations = tuple(operations)
        ops = tuple((op.api, op.name) for op in operations)
        for api, name in ops:
            for answer in ANSWERS.values():
                self.duplicates.labels(api, name, answer)
        self.unknown.operations = ops
        self.budgets.operations = tuple(op for op in operations if op.budgets)

    def watch_db(self, path: Path | str | None, *, lock_timeout: float = 5.0) -> None:
        """The receipts database the unknown-outcomes gauge reads: a SQLite path or a PostgreSQL URL (None: none)."""
        self.unknown.watch(path, lock_timeout)

    def close(self) -> None:
        self.unknown.watch(None, 0)


class UnknownOutcomes:
    """
    The `unknown_outcomes` gauge, read from the database when scraped: one query (receipts in
    UNKNOWN states, by api, operation and state) on a read connection of its own, opened at the
    first scrape, used by one scrape at a time (the HTTP server answers each on a thread).
    A database that cannot be read leaves the gauge out of that scrape, and logs why.
    """

    NAME = f"{PREFIX}unknown_outcomes"
    HELP = "Receipts whose outcome is not known (yet), in the receipts database, read at scrape time"

    def __init__(self) -> None:
        self.operations: tuple[tuple[str, str], ...] = ()  # shown with 0 when they have none
        self._lock = threading.Lock()
        self._path: Path | str | None = None
        self._lock_timeout = 5.0
        self._store: ReceiptStore | None = None

    def watch(self, path: Path | str | None, lock_timeout: float) -> None:
        with self._lock:
            if path != self._path:
                self._close()
            self._path, self._lock_timeout = path, lock_timeout

    def _close(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            except ReceiptsError as e:
                logger.debug(f"receipt-proxy metrics: {e}")
            self._store = None

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.NAME, self.HELP, labels=(*OP, "state"))

    def read(self, what: str, query: Callable[[ReceiptStore], T]) -> T | None:
        """`query` on the read connection, one scrape at a time; None (logged) when there is no database or it fails."""
        with self._lock:
            if self._path is None:
                return None
            try:
                if self._store is None:
                    self._store = open_store(self._path, create=False, lock_timeout=self._lock_timeout)
                return query(self._store)
            except ReceiptsError as e:
                logger.warning(f"receipt-proxy metrics: {what} left out of this scrape: {e}")
                self._close()
                return None

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=(*OP, "state"))
        counts = self.read(self.NAME, lambda store: store.counts_by_operation(UNKNOWN))
        if counts is None:
            return
        keys = {(api, name, state): 0 for api, name in self.operations for state in UNKNOWN} | counts
        for (api, name, state), n in sorted(keys.items()):
            family.add_metric((api, name, str(state)), n)
        yield family
