"""
Effect budgets, counted from receipts (an operation's `budget:`, rules/load_budgets.py).

A new receipt takes its share of each of its operation's budgets (`Attempt.charges`, made by
intent/budget_charges.py) in the transaction that inserts it: one row of `budget_charges` (m014)
per budget, naming the receipt, and the same amount added to the budget's `budget_use` row for the
window. A receipt that becomes `rejected` or `not_sent` (proven not done) gives its share back in
the transaction that records that state (`_give_back`, from transitions.py `_step`). So a budget's
use is, at every commit, the sum of the window's charges whose receipt did not end rejected or
not_sent (a receipt pruned meanwhile keeps its share), read in one indexed row, whatever the size
of the budget; `recount` computes it again from the receipts, to check.

    used = store.budget_use("test-api/things.create/budget[0]/3600s/count", HOUR)[0].used
    verdict = over_budget([(charge, used)], now)     # None: room; else Overrun(why, retry_after)

The decision is serialized with every other decision on the same budget: on SQLite, by the
write transaction (one writer at a time); on PostgreSQL, by an advisory lock on the budget
(its name among the attempt's intents, attempts.py `_intents`: postgres.py, "One winner per
intent"), so that two proxies of a fleet never both take the last unit. A give-back runs under
its receipt's lock only: its UPDATE of the use row waits for that row's lock, and both changes
are relative (`used = used ± amount`), so neither is lost; a decision that read the use before a
give-back committed refuses at worst one unit early, never admits past the budget. Use rows are
locked in one order (budget, principal, window) by every writer: no deadlock among them.

Windows are fixed and aligned to the UTC epoch (`window_of`): an hour's window is 10:00 to 11:00,
whatever the proxy's clock says it is then. `over_budget` is a plain function of a charge and
its use: what a shadow mode calls to know what enforcement would have done.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass

from proxy_addon.states import State
from proxy_addon.store.base import Backend
from proxy_addon.store.records import Attempt, Charge, iso

GIVES_BACK = (State.REJECTED, State.NOT_SENT)  # a receipt that ends so is not counted: proven not done


@dataclass(frozen=True)
class Overrun:
    """Why a write is over budget, and in how many seconds the (last) full budget's window turns."""

    why: str
    retry_after: int


@dataclass(frozen=True)
class BudgetUse:
    """A budget's use in its current window, for `receipts budgets` and the metrics."""

    principal: str  # "" for a budget per operation
    used: float
    writes: int  # the receipts that hold a share now


def window_of(now: dt.datetime, seconds: int) -> tuple[int, int]:
    """The window `now` is in, as UTC epoch seconds: [start, end), `start` a multiple of `seconds`."""
    t = math.floor(now.timestamp())
    start = t - t % seconds
    return start, start + seconds


def over_budget(uses: Sequence[tuple[Charge, float]], now: dt.datetime) -> Overrun | None:
    """
    Whether a write taking each charge's amount passes a budget, given each budget's use so far in
    its window; None when every one has room. Retry-After: when the last full budget's window turns.
    """
    over: list[str] = []
    retry = 0
    for charge, used in uses:
        if used + charge.amount - charge.limit <= 1e-9 * max(1.0, abs(charge.limit)):
            continue
        start, end = window_of(now, charge.window)
        retry = max(retry, math.ceil(end - now.timestamp()))
        alone = "; this write alone is more than the budget" if charge.amount > charge.limit else ""
        over.append(
            f"{charge.what}: {_shown(used)} of {_shown(charge.limit)} used in the window "
            f"{_at(start)} to {_at(end)}, this write takes {_shown(charge.amount)}{alone}"
        )
    if not over:
        return None
    return Overrun("; ".join(over), max(1, retry))


def _shown(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _at(epoch: int) -> str:
    return iso(dt.datetime.fromtimestamp(epoch, dt.UTC)).replace(".000000Z", "Z")


class ReceiptBudgets(Backend):
    """Charging a new receipt to its budgets, giving a share back, and reading what they hold."""

    def _budget_overrun(self, a: Attempt, now: dt.datetime) -> Overrun | None:
        """In the deciding transaction: whether the attempt passes one of its budgets (None: every one has room)."""
        if not a.charges:
            return None
        return over_budget([(c, self._used(c, now)) for c in a.charges], now)

    def _used(self, c: Charge, now: dt.datetime) -> float:
        start, _ = window_of(now, c.window)
        rows = self._rows(
            "SELECT used FROM budget_use WHERE budget_key = ? AND principal = ? AND window_start = ?",
            (c.key, c.principal, start),
        )
        return float(rows[0]["used"]) if rows else 0.0

    def _charge(self, operation_id: str, a: Attempt, now: dt.datetime) -> None:
        """In the transaction that inserts the receipt: its share of each budget, in the one order of use rows."""
        for c in sorted(a.charges, key=lambda c: (c.key, c.principal)):
            start, end = window_of(now, c.window)
            self._execute(
                "INSERT INTO budget_charges (operation_id, budget_key, principal, amount, window_start, window_end) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (operation_id, c.key, c.principal, c.amount, start, end),
            )
            self._execute(
                "INSERT INTO budget_use (budget_key, principal, window_start, window_end, used, writes) "
                "VALUES (?, ?, ?, ?, ?, 1) ON CONFLICT (budget_key, principal, window_start) "
                "DO UPDATE SET used = budget_use.used + excluded.used, writes = budget_use.writes + 1",
                (c.key, c.principal, start, end, c.amount),
            )

    def _give_back(self, operation_id: str) -> None:
        """In the transaction that makes a receipt rejected or not_sent: its shares back (none if it took none)."""
        for c in self._rows(
            "SELECT budget_key, principal, window_start, amount FROM budget_charges WHERE operation_id = ? "
            "ORDER BY budget_key, principal",
            (operation_id,),
        ):
            self._execute(
                "UPDATE budget_use SET used = used - ?, writes = writes - 1 "
                "WHERE budget_key = ? AND principal = ? AND window_start = ?",
                (c["amount"], c["budget_key"], c["principal"], c["window_start"]),
            )

    def budget_use(self, key: str, window: int, *, top: int = 10) -> list[BudgetUse]:
        """
        A budget's use in its current window, by principal (one entry, "", for a budget per
        operation), the most used first, at most `top` of them; none when nothing holds a share.
        """
        start, _ = window_of(self.clock(), window)
        rows = self._rows(
            "SELECT principal, used, writes FROM budget_use WHERE budget_key = ? AND window_start = ? AND writes > 0 "
            "ORDER BY used DESC, principal LIMIT ?",
            (key, start, top),
        )
        return [BudgetUse(r["principal"], round(float(r["used"]), 9), int(r["writes"])) for r in rows]

    def recount(self, key: str, window: int) -> dict[str, float]:
        """A budget's use in its current window by principal, summed again from its charges and their receipts."""
        start, _ = window_of(self.clock(), window)
        rows = self._rows(
            "SELECT c.principal AS principal, SUM(c.amount) AS used FROM budget_charges c "
            "LEFT JOIN receipts r ON r.operation_id = c.operation_id WHERE c.budget_key = ? AND c.window_start = ? "
            "AND (r.state IS NULL OR r.state NOT IN (?, ?)) GROUP BY c.principal",
            (key, start, *GIVES_BACK),
        )
        return {r["principal"]: float(r["used"]) for r in rows}

    def _forget_charges(self, now: dt.datetime) -> None:
        """In `prune`: the charges and the use of windows that have ended (nothing counts them any more)."""
        ended = math.floor(now.timestamp())
        self._execute("DELETE FROM budget_charges WHERE window_end <= ?", (ended,))
        self._execute("DELETE FROM budget_use WHERE window_end <= ?", (ended,))
