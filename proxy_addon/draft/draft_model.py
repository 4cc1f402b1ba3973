"""
A drafted rules file before it is written: its top-level keys, its operations, and the notes and
TODOs that go beside them as YAML comments (draft_yaml.py writes it).

Every value here is one the rules loader takes as it is; what the drafter could not decide is a
TODO (a `# TODO:` comment, which `receipts rules check` lists as a warning), whose text says
which part of the source it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DraftOperation:
    name: str
    method: str
    path: str
    description: str | None = None
    notes: list[str] = field(default_factory=list)  # plain comments above the operation
    todos: list[str] = field(default_factory=list)  # `# TODO:` comments above the operation
    fingerprint: dict[str, list[str]] | None = None  # None: the rules' default (path parameters, the whole body)
    external_id: Any = None  # a field, a list of fields, or {"header": name}
    idempotency_key: dict[str, Any] | None = None
    record: bool = True
    classify: list[dict[str, Any]] | None = None
    # comments before `classify:` and `reconcile:` (or in their place); one starting `TODO: ` is a TODO
    classify_notes: list[str] = field(default_factory=list)
    reconcile: dict[str, Any] | None = None
    reconcile_notes: list[str] = field(default_factory=list)


@dataclass
class DraftFile:
    api: str
    hosts: list[str]
    source: str  # what it was drafted from, for the header
    credentials: dict[str, Any] | None = None
    post_reads: list[tuple[str, str]] = field(default_factory=list)  # (path template, why it is a read)
    notes: list[str] = field(default_factory=list)  # the header's comments
    todos: list[str] = field(default_factory=list)  # the file's TODOs
    credentials_notes: list[str] = field(default_factory=list)
    operations: list[DraftOperation] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # operations not drafted, and why (comments at the end)

    def todo_count(self) -> int:
        notes = (n for op in self.operations for n in (*op.classify_notes, *op.reconcile_notes))
        return (
            len(self.todos) + sum(len(op.todos) for op in self.operations) + sum(n.startswith("TODO: ") for n in notes)
        )
