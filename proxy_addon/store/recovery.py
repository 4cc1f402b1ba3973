"""
Recovery at start: receipts left in flight (`submitted`, `reconciling`) or held
(`awaiting_approval`) by a proxy instance that is no longer running are moved on
(`recover_in_flight`), so that none stays unresolved for ever. A `submitted` receipt waiting for
its client's input or for its task has nothing in flight, and stays (store/rounds.py).
"""

from __future__ import annotations

from collections.abc import Callable

from proxy_addon.errors import IllegalTransition
from proxy_addon.states import State
from proxy_addon.store.transitions import ReceiptTransitions


class ReceiptRecovery(ReceiptTransitions):
    """Moving on the receipts a stopped proxy left in flight or held."""

    def recover_in_flight(
        self,
        *,
        is_alive: Callable[[str | None], bool],
        actor: str = "proxy",
        stopped: Callable[[str | None], str] | None = None,
    ) -> list[str]:
        """
        Receipts left `submitted` (or `reconciling`) by a proxy instance that is no longer
        running become `outcome_unknown`: the request may have left; `awaiting_approval` ones
        become `not_sent`: they never left. A `submitted` one keeps no `completed_at`: nobody saw
        its attempt end, and it may be in flight until its `in_flight_until`. Returns their ids.
        `is_alive` is asked only after the receipts in flight were read (gate/leases.py relies on it).
        `stopped(instance)` words how the instance was found stopped (default "proxy stopped"), so
        that the event names it. A `submitted` receipt that waits for its client's input or for its
        task (store/rounds.py) is left as it is: nothing of it is in flight (its last round's answer came),
        its client may still go on, and its task may still be read; it is settled as it would have been.
        """
        rows = self._rows(
            "SELECT operation_id, state, instance FROM receipts WHERE state IN (?, ?, ?) "
            "AND (waiting_for IS NULL OR state <> ?)",
            (State.SUBMITTED, State.RECONCILING, State.AWAITING_APPROVAL, State.SUBMITTED),
        )
        recovered = []
        outcomes = {
            State.SUBMITTED: (State.OUTCOME_UNKNOWN, "proxy stopped while the request was in flight"),
            State.RECONCILING: (State.OUTCOME_UNKNOWN, "proxy stopped while reconciling"),
            State.AWAITING_APPROVAL: (State.NOT_SENT, "proxy stopped while the request awaited approval"),
        }
        for row in rows:
            if is_alive(row["instance"]):
                continue
            state = State(row["state"])
            to, reason = outcomes[state]
            if stopped is not None:
                reason = reason.replace("proxy stopped", stopped(row["instance"]), 1)
            # Its proxy never saw the attempt end: no `completed_at` (a read then waits out the request's
            # lifetime, `in_flight_until`, before it may prove absence: reconcile/judge.py).
            unseen = {"completed_at": None} if state is State.SUBMITTED else {}
            try:
                self.transition(
                    row["operation_id"], to, reason=reason, actor=actor, expect=[state], error=reason, **unseen
                )
            except IllegalTransition:
                continue  # another process moved it on meanwhile
            recovered.append(row["operation_id"])
        return recovered
