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
