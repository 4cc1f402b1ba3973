"""
The proxy's metrics without a proxy (gate/metrics.py), on each backend: the store tells its observer each
committed state change and nothing else, and the unknown-outcomes gauge reads the database at each
scrape. Through a real proxy: tests/e2e/proxy/test_metrics.py.
"""

from __future__ import annotations

import pytest

from proxy_addon.errors import IllegalTransition
from proxy_addon.gate.metrics import Metrics
from proxy_addon.states import State
from proxy_addon.store import open_store
from tests.mitm.conftest import setup  # noqa: F401  (the taddons fixture, for the run-time change)
from tests.store.test_receipts import attempt


@pytest.fixture
def db(backend_db) -> str:
    """A receipts database on each backend (tests/conftest.py)."""
    return backend_db


def test_the_store_tells_its_observer_each_committed_state_change_and_nothing_else(db):
    store = open_store(db)
    told: list[tuple] = []
    store.observer = lambda *change: told.append(change)
    first = store.begin_attempt(attempt("fp-1")).receipt
    assert store.begin_attempt(attempt("fp-1")).kind == "blocked"  # a duplicate changes no state
    store.transition(first.operation_id, State.SUCCEEDED, reason="HTTP 201")
    with pytest.raises(IllegalTransition):  # refused, rolled back: not told
        store.transition(first.operation_id, State.REJECTED, reason="no")
    assert told == [
        ("example", "articles.create", None, State.SUBMITTED),
        ("example", "articles.create", State.SUBMITTED, State.SUCCEEDED),
    ]

    def broken(*change):
        raise RuntimeError("a broken observer")

    store.observer = broken  # committed is committed: the write still returns, and stays written
    second = store.begin_attempt(attempt("fp-2")).receipt
    assert store.transition(second.operation_id, State.OUTCOME_UNKNOWN, reason="reset").state is State.OUTCOME_UNKNOWN
    assert open_store(db, create=False).get(second.operation_id).state is State.OUTCOME_UNKNOWN
    assert store._told is None  # nothing kept between transactions


def test_the_unknown_outcomes_gauge_reads_the_database_at_each_scrape(db):
    store = open_store(db)
    metrics = Metrics()
    gauge = lambda: {  # noqa: E731
        tuple(s.labels.values()): s.value for family in metrics.unknown.collect() for s in family.samples if s.value
    }
    assert gauge() == {}  # no database watched: no samples
    metrics.watch_db(db)
    for fp, to in (("a", State.OUTCOME_UNKNOWN), ("b", State.OUTCOME_UNKNOWN), ("c", State.SUCCEEDED)):
        store.transition(store.begin_attempt(attempt(fp)).receipt.operation_id, to, reason="x")
    assert gauge() == {("example", "articles.create", "outcome_unknown"): 2}
    unknown = store.list(states=[State.OUTCOME_UNKNOWN])[0]
    store.claim_for_reconcile(unknown.operation_id, actor="test")
    assert gauge() == {
        ("example", "articles.create", "outcome_unknown"): 1,
        ("example", "articles.create", "reconciling"): 1,
    }
    metrics.close()


BUDGETED = """
api: pay
hosts: [api.pay.test]
operations:
  charge:
    match: {method: POST, path: /charges}
    fingerprint: {body: [amount]}
    budget:
      - {per: principal, window: 366d, count: 3}
      - {window: 366d, sum: amount, max: 1000}
  refund:
    match: {method: POST, path: /refunds}
"""


def test_the_budget_gauges_show_each_budgets_use_and_limit_at_each_scrape(db):
    from proxy_addon.intent.budget_charges import charges_of
    from proxy_addon.rules import load_rules

    rules = load_rules(BUDGETED, "pay.yaml")
    op = rules.operations[0]
    store = open_store(db)
    metrics = Metrics()
    metrics.known(rules.operations)

    def samples() -> dict[tuple, float]:
        return {
            (family.name, *s.labels.values()): s.value for family in metrics.budgets.collect() for s in family.samples
        }

    only_limits = samples()  # no database watched: the limits, no use
    assert only_limits == {
        ("receipt_proxy_budget_limit", "pay", "charge", "budget[0]", "principal"): 3,
        ("receipt_proxy_budget_limit", "pay", "charge", "budget[1]", "operation"): 1000,
    }
    metrics.watch_db(db)
    for n, (who, amount) in enumerate([("alice", 100), ("alice", 200), ("bob", 50)]):
        intent = {"body": {"amount": amount}}
        a = attempt(f"fp-{n}")
        store.begin_attempt(
            a.__class__(
                **{
                    **a.__dict__,
                    "api": "pay",
                    "operation": "charge",
                    "principal": who,
                    "charges": charges_of(op, intent, who),
                }
            )
        )
    used = {k[2:]: v for k, v in samples().items() if k[0] == "receipt_proxy_budget_used"}
    assert used == {("charge", "budget[0]", "principal"): 2, ("charge", "budget[1]", "operation"): 350}
    metrics.close()
