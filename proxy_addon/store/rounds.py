"""
Answers that are not a write's outcome: an MCP tool call whose server asks the client for input
(`input_required`, the 2026-07-28 revision's multi-round-trip requests) or runs the call as a task
(a task handle: the Tasks extension, or a 2025-11-25 task-augmented call).

Such a receipt stays `submitted` (it is unresolved: a duplicate is blocked), with nothing in flight,
and says what it waits for in `waiting_for`:

- "input": the server asked for input (`mcp_rounds` counts how often). The client's next round,
  the same call carrying `requestState`/`inputResponses` (`Attempt.continues`), is the same write
  going on: `_continue` sends it under this receipt (in_flight_until and instance renewed, durably,
  before it is sent), and its answer decides the receipt. A new call of the same intent is a
  duplicate, answered at once (never made to wait for an outcome that needs the client). A server
  that asks more often than `Attempt.mcp_rounds` (receipts_mcp_rounds) allows gets no more rounds:
  the receipt becomes `outcome_unknown` (nothing proves that no round acted), and the client is told
  why (`Decision.note`). A call whose client has not gone on by `waiting_until`
  (receipts_mcp_input_wait) is taken as abandoned, `outcome_unknown`, when an attempt of its
  intent next comes.
- "task": the server runs the call as a task. Its id is sealed (sealing.py), found again by a keyed
  reference (`waiting_task`); `task_status` is its status as last seen (`note_task`). The task's
  final answer settles the receipt as any outcome (`record_outcome`: the gate reads it, outcome/task_ends.py).

Recovery leaves such receipts as they are: nothing of theirs is in flight (store/recovery.py).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from proxy_addon.errors import IllegalTransition, StoreError
from proxy_addon.states import State
from proxy_addon.store.records import Attempt, Decision, Interim, Receipt, iso, state_of
from proxy_addon.store.transitions import ReceiptTransitions

HINT = 8  # characters of a task id kept in clear, to tell the task by
_UNSHOWN = re.compile(r"[^A-Za-z0-9._-]")


def task_hint(task_id: str) -> str:
    """The first HINT characters of a task id, only letters, digits and `._-` (others as `?`), then `…`."""
    return _UNSHOWN.sub("?", task_id[:HINT]) + ("…" if len(task_id) > HINT else "")


class ReceiptInterim(ReceiptTransitions):
    """Receipts waiting for their client's input or for their task (module docstring)."""

    def record_interim(
        self, operation_id: str, interim: Interim, *, flow_id: str | None = None, input_wait: float | None = None
    ) -> Receipt:
        """
        An interim answer to a `submitted` receipt's request (not waiting already): it waits from
        now, with nothing in flight. IllegalTransition when the receipt moved on meanwhile.
        Committed without waiting for the disk, as an outcome is: lost to an OS crash, the receipt
        is `submitted` again, and recovery makes it outcome_unknown.
        """
        with self._write(durable=False, receipt=operation_id):
            rows = self._rows("SELECT * FROM receipts WHERE operation_id = ?", (operation_id,))
            if not rows:
                raise IllegalTransition(f"no receipt {operation_id}")
            old = rows[0]
            was = state_of(old["state"], f"receipt {operation_id}")
            now = self.clock()
            at = iso(now)
            # The round is over (its answer came): completed_at, as for an outcome (judge.landed_by).
            sets: dict[str, Any] = {"completed_at": at, "updated_at": at}
            if interim.kind == "input_required":
                rounds = (old.get("mcp_rounds") or 0) + 1
                until = iso(now + dt.timedelta(seconds=input_wait)) if input_wait else None
                sets.update(waiting_for="input", mcp_rounds=rounds, waiting_until=until)
                event, reason = "input_required", f"round {rounds}: {interim.reason}"
            else:
                if self.answer_seal is None:
                    raise StoreError(f"cannot record the task of receipt {operation_id}: this store has no key")
                task_id = interim.task_id or ""
                sets.update(
                    waiting_for="task",
                    task_ref=self.answer_seal.task_ref(old["api"], task_id),
                    task_sealed=self.answer_seal.seal_task(operation_id, task_id),
                    task_hint=task_hint(task_id),
                    task_status=interim.task_status,
                    task_revision=interim.task_revision,
                    waiting_until=iso(now + dt.timedelta(seconds=interim.task_ttl)) if interim.task_ttl else None,
                )
                event, reason = "task", f"task {task_hint(task_id)}: {interim.reason}"
            changed = self._execute(
                f"UPDATE receipts SET {', '.join(f'{k} = ?' for k in sets)} "
                "WHERE operation_id = ? AND state = ? AND waiting_for IS NULL",
                (*sets.values(), operation_id, State.SUBMITTED),
            )
            if changed != 1:
                raise IllegalTransition(f"receipt {operation_id} is {was}, waiting for {old.get('waiting_for')}")
            self._event(operation_id, event, State.SUBMITTED, State.SUBMITTED, reason, "proxy", flow_id, at)
            return Receipt.from_row({**old, **sets})

    def waiting_task(self, api: str, task_id: str) -> Receipt | None:
        """The receipt of `api` waiting for this task, if any."""
        if self.answer_seal is None:
            return None
        rows = self._rows(
            "SELECT * FROM receipts WHERE task_ref = ? AND state = ? AND waiting_for = 'task' LIMIT 1",
            (self.answer_seal.task_ref(api, task_id), State.SUBMITTED),
        )
        return Receipt.from_row(rows[0]) if rows else None

    def note_task(self, operation_id: str, status: str, reason: str, *, flow_id: str | None = None) -> bool:
        """A waiting receipt's task seen in another status (one event per change); False when nothing changed."""
        with self._write(durable=False, receipt=operation_id):
            at = iso(self.clock())
            changed = self._execute(
                "UPDATE receipts SET task_status = ?, updated_at = ? WHERE operation_id = ? AND state = ? "
                "AND waiting_for = 'task' AND (task_status IS NULL OR task_status <> ?)",
                (status, at, operation_id, State.SUBMITTED, status),
            )
            if changed:
                self._event(operation_id, "task", State.SUBMITTED, State.SUBMITTED, reason, "proxy", flow_id, at)
            return bool(changed)

    # --- in `_decide`'s transaction (attempts.py) --------------------------------------------

    @staticmethod
    def _abandoned(r: Receipt, now: dt.datetime) -> bool:
        """Waiting for input past its `waiting_until`: its client is taken as gone."""
        return r.waiting_until is not None and now >= dt.datetime.fromisoformat(r.waiting_until)

    def _input_abandoned(self, r: Receipt, a: Attempt, actor: str) -> Receipt:
        why = (
            f"its server asked for input (round {r.mcp_rounds}) and the client did not go on by {r.waiting_until} "
            "(receipts_mcp_input_wait): the call did not complete, and whether a round acted is unknown"
        )
        return self._step(
            r.operation_id,
            State.OUTCOME_UNKNOWN,
            frozenset({State.SUBMITTED}),
            {"error": why},
            why,
            actor,
            a.flow_id,
            set_completed=False,  # its last round ended when its answer came (record_interim)
        )

    def _rounds_exceeded(self, r: Receipt, a: Attempt, actor: str) -> Decision:
        why = (
            f"its server asked for input {r.mcp_rounds} times, more than receipts_mcp_rounds ({a.mcp_rounds}) allows: "
            "the next round was not sent; the call did not complete, and whether a round acted is unknown"
        )
        done = self._step(
            r.operation_id,
            State.OUTCOME_UNKNOWN,
            frozenset({State.SUBMITTED}),
            {"error": why},
            why,
            actor,
            a.flow_id,
            set_completed=False,
        )
        return Decision("blocked", done, f"duplicate blocked: {why}", note=why)

    def _continue(self, r: Receipt, a: Attempt, now: dt.datetime, actor: str) -> Decision:
        """
        The client's next round of a call waiting for input: sent under its receipt, which is in
        flight again from now (durably: the caller's transaction is), by this proxy.
        """
        at = iso(now)
        sets: dict[str, Any] = {
            "waiting_for": None,
            "waiting_until": None,
            "completed_at": None,  # in flight again: nobody has seen this round end
            "in_flight_until": iso(now + dt.timedelta(seconds=a.upstream_timeout)) if a.upstream_timeout else None,
            "upstream_timeout": a.upstream_timeout,
            "instance": a.instance,
            "updated_at": at,
        }
        self._hold_lease(a)
        changed = self._execute(
            f"UPDATE receipts SET {', '.join(f'{k} = ?' for k in sets)} "
            "WHERE operation_id = ? AND state = ? AND waiting_for = 'input'",
            (*sets.values(), r.operation_id, State.SUBMITTED),
        )
        if changed != 1:
            raise IllegalTransition(f"receipt {r.operation_id} no longer waits for input")
        reason = f"round {r.mcp_rounds + 1}: the client sent the input its server asked for; sent under this receipt"
        self._event(r.operation_id, "continued", State.SUBMITTED, State.SUBMITTED, reason, actor, a.flow_id, at)
        rows = self._rows("SELECT * FROM receipts WHERE operation_id = ?", (r.operation_id,))
        return Decision("forward", Receipt.from_row(rows[0]), "the next round of a call waiting for input")

    def _task_id_for(self, r: Receipt, a: Attempt, sealed: Any) -> str | None:
        """A waiting receipt's task id, opened for a duplicate from its own caller (never for one it may not be)."""
        if r.waiting_for != "task" or r.state is not State.SUBMITTED or not sealed or self.answer_seal is None:
            return None
        if r.intent_fingerprint in a.unreplayable:
            return None
        try:
            return self.answer_seal.open_task(r.operation_id, bytes(sealed))
        except StoreError:
            return None

    def _hold_lease(self, a: Attempt) -> None:
        """Before this proxy sends under a receipt: its lease must hold (a fleet's store: fleet.py)."""
