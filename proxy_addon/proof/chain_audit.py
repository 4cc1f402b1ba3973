"""
Walking a chain in order (docs/proof.md, "Verifying"): the first record that breaks it, and why.

    audit = ChainAudit(heads)                 # the signed heads (checkpoints), signatures checked
    for kind, row in records:                 # "event" or "mark" rows, by chain position
        audit.add(kind, row)
    for operation_id, state in receipts:
        audit.receipt(operation_id, state)
    verdict = audit.verdict()                 # verdict.intact, verdict.line()

It stops at the first break (a later record is not read). What breaks the chain:
- a position missing (a record deleted), repeated, or a record with no position;
- a record whose `prev_hash` is not the hash of the record before (one moved, or one before changed);
- a record whose fields do not hash to its `hash` (edited);
- a signed head that the chain does not reach (truncated), or whose hash is not the chain's there;
- a receipt whose state is not the `to_state` of its last `transition` event (its state edited
  without an event), a receipt with no transition event, or events whose receipt is gone.
A pruned range (a `pruned` mark) keeps only the hash of its last record: the chain links
through it, and a signed head at or after it vouches for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from proxy_addon.proof.chain_links import GENESIS, record_hash

Kind = Literal["event", "mark"]


@dataclass(frozen=True)
class SignedHead:
    """What a checkpoint signed: the chain's length, the hash of its last record, when."""

    size: int
    head: str
    time: str


@dataclass(frozen=True)
class Verdict:
    intact: bool
    events: int  # the events walked (pruned ones not counted)
    last_head: SignedHead | None  # the last signed head the chain matched
    why: str = ""  # the first break, when not intact

    def line(self) -> str:
        if not self.intact:
            return f"broken: {self.why}"
        if self.last_head is None:
            return f"intact: {self.events} events, no signed checkpoint yet"
        h = self.last_head
        return f"intact: {self.events} events, last checkpoint at {h.time} (position {h.size})"


class Broken(Exception):
    """The first break: its message says where and why."""


def _name(kind: Kind, row: dict[str, Any]) -> str:
    if kind == "mark":
        return f"chain mark {row.get('mark')!r} at position {row.get('chain_seq')}"
    return f"event {row.get('id')} (position {row.get('chain_seq')}) of receipt {row.get('operation_id')}"


class ChainAudit:
    """Checks records fed in chain order; `verdict()` at the end. Holds one state per receipt, nothing per record."""

    def __init__(self, heads: Iterable[SignedHead] = ()):
        self.heads = sorted(heads, key=lambda h: h.size)
        self._next_head = 0  # the index of the first head not reached yet
        self.position = 0  # the last position walked
        self.hash = GENESIS  # the hash at `position`
        self.events = 0
        self.last_head: SignedHead | None = None
        # receipt -> (the to_state of its last transition, that event's id)
        self.states: dict[str, tuple[str | None, int | None]] = {}
        self.seen: set[str] = set()  # receipts checked by `receipt`
        self.why: str | None = None

    def add(self, kind: Kind, row: dict[str, Any]) -> bool:
        """Check the next record; False once the chain is broken (this one or one before)."""
        if self.why is not None:
            return False
        try:
            self._link(kind, row)
        except Broken as e:
            self.why = str(e)
            return False
        return True

    def _link(self, kind: Kind, row: dict[str, Any]) -> None:
        name, pos = _name(kind, row), row.get("chain_seq")
        if not isinstance(pos, int):
            raise Broken(f"{name} has no chain position: written around the proxy, not appended to the chain")
        if pos != self.position + 1:
            missing = f"position {self.position + 1} is missing (deleted)" if pos > self.position else "repeated"
            raise Broken(f"{name}: {missing}; the chain ends at position {self.position} before it")
        if row.get("prev_hash") != self.hash:
            raise Broken(
                f"{name}: its prev_hash is not the hash of position {self.position} "
                "(a record moved, or one before it was changed)"
            )
        pruned = kind == "mark" and row.get("mark") == "pruned"
        if not pruned and record_hash(row) != row.get("hash"):
            raise Broken(f"{name}: its fields do not match its hash (edited)")
        self.hash = str(row["hash"])
        self.position = int(row.get("through") or pos) if pruned else pos
        if kind == "event":
            self.events += 1
            self._note_event(row)
        self._reach_heads(name)

    def _note_event(self, row: dict[str, Any]) -> None:
        if row.get("event") == "transition":
            self.states[str(row["operation_id"])] = (row.get("to_state"), row.get("id"))
        else:
            self.states.setdefault(str(row["operation_id"]), (None, None))

    def _reach_heads(self, name: str) -> None:
        while self._next_head < len(self.heads) and self.heads[self._next_head].size <= self.position:
            head = self.heads[self._next_head]
            self._next_head += 1
            if head.size < self.position:
                continue  # inside a pruned range: its records are gone, the range's end is checked
            if head.head != self.hash:
                raise Broken(
                    f"{name}: the checkpoint of {head.time} signed another hash at position {head.size} "
                    "(the history before it was rewritten)"
                )
            self.last_head = head

    def receipt(self, operation_id: str, state: str) -> bool:
        """Check a receipt's state against its last transition event (after every record)."""
        if self.why is not None:
            return False
        self.seen.add(operation_id)
        last, event_id = self.states.get(operation_id, (None, None))
        if last is None:
            self.why = (
                f"receipt {operation_id} has no transition event (its events deleted, or written around the proxy)"
            )
        elif last != state:
            self.why = (
                f"receipt {operation_id} is {state}, but its last transition (event {event_id}) is to {last}: "
                "its state was edited without an event"
            )
        return self.why is None

    def verdict(self) -> Verdict:
        """After every record and receipt: intact, or the first break."""
        if self.why is None and self._next_head < len(self.heads):
            head = self.heads[-1]
            self.why = (
                f"the chain ends at position {self.position}, but the checkpoint of {head.time} signed "
                f"{head.size} records: the history was truncated"
            )
        if self.why is None:
            orphans = sorted(set(self.states) - self.seen)
            if orphans:
                self.why = f"events of receipt {orphans[0]} remain, the receipt does not (deleted around the proxy)"
        return Verdict(self.why is None, self.events, self.last_head, self.why or "")
