"""
The budget gauges (gate/metrics.py): each budget the rules declare, its use in its current window
and its limit, read from the database when scraped (every process's receipts: the fleet's use).

    receipt_proxy_budget_used{api,operation,budget="budget[0]",per="principal"}   12
    receipt_proxy_budget_limit{api,operation,budget="budget[0]",per="principal"}  20

A budget per principal shows the most any one principal used: a principal is never a label (one
series per caller would grow without bound). `receipts budgets` lists them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from proxy_addon.intent.budget_charges import budget_key
from proxy_addon.rules import Operation
from proxy_addon.store import ReceiptStore

LABELS = ("api", "operation", "budget", "per")
USED = ("receipt_proxy_budget_used", "Each budget's use in its current window (per principal: the most any one used)")
LIMIT = ("receipt_proxy_budget_limit", "Each budget's limit: writes per window, or the most of the summed field")

Read = Callable[[str, Callable[[ReceiptStore], Any]], Any]  # metrics.UnknownOutcomes.read


class BudgetGauges:
    """A collector of the two gauges; `operations`: the rules' operations that have budgets (Metrics.known)."""

    def __init__(self, read: Read) -> None:
        self.read = read
        self.operations: tuple[Operation, ...] = ()

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(*USED, labels=LABELS)
        yield GaugeMetricFamily(*LIMIT, labels=LABELS)

    def collect(self) -> Iterator[Metric]:
        budgets = [(op, b) for op in self.operations for b in op.budgets]
        if not budgets:
            return
        used = GaugeMetricFamily(*USED, labels=LABELS)
        limit = GaugeMetricFamily(*LIMIT, labels=LABELS)

        def uses(store: ReceiptStore) -> list[float]:
            return [
                top[0].used if (top := store.budget_use(budget_key(op, b), b.window, top=1)) else 0.0
                for op, b in budgets
            ]

        found = self.read(USED[0], uses)
        for i, (op, b) in enumerate(budgets):
            labels = (op.api, op.name, f"budget[{b.index}]", b.per)
            limit.add_metric(labels, float(b.limit))
            if found is not None:
                used.add_metric(labels, found[i])
        if found is not None:
            yield used
        yield limit
