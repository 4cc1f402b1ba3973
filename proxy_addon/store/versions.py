"""
Which fingerprint versions the receipts still hold: the schemes (fingerprint.SCHEME) and the
rules (Operation.fingerprint_rule, by digest) that made receipts which can still answer a
retry. The proxy fingerprints a request under those too (intent/earlier_fingerprints.py), so that
neither an upgrade nor an edited rule turns a retry into a new write.

    store.remember_rules({digest: rule_json, ...})   # each rule's description, once (at load and reload)
    store.fingerprint_versions()                     # [Held(...)], what can still answer a retry

Receipts made before versions were recorded have NULL in both columns (scheme 1 or 2, the
rule as it is now). `INDEXED_SCHEME` is the scheme that migration m009's partial index calls
current: a receipt of an earlier one is in the index, a new receipt never is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy_addon.states import UNRESOLVED, State
from proxy_addon.store.base import Backend, marks
from proxy_addon.store.records import iso, state_of

INDEXED_SCHEME = 3  # fingerprint.SCHEME when m009 was written; a new scheme needs a new index
_EARLIER_SCHEME = f"(fingerprint_scheme IS NULL OR fingerprint_scheme < {INDEXED_SCHEME})"  # m009's index, verbatim


@dataclass(frozen=True)
class Held:
    """Receipts of one operation, made under one fingerprint version, in one state."""

    api: str
    operation: str
    scheme: int | None  # None: before schemes were recorded (scheme 1 or 2)
    rule_digest: str | None  # None: before rules were recorded (the rule as it is now)
    rule: dict[str, Any] | None  # the rule's description, where the store has it
    state: State
    count: int
    last_updated: str  # the newest of their updated_at (a success: when it succeeded)
    newest: str  # the newest one's id (receipt ids sort by time), to name them


class ReceiptVersions(Backend):
    """The fingerprint versions receipts were made with, and the rules' descriptions."""

    def remember_rules(self, rules: Mapping[str, str]) -> None:
        """Keep each rule description (digest → canonical JSON) the store does not have yet."""
        if not rules:
            return
        known = {r["digest"] for r in self._rows("SELECT digest FROM fingerprint_rules")}
        new = [(d, text) for d, text in rules.items() if d not in known]
        if not new:
            return
        at = iso(self.clock())
        with self._write(durable=False):
            for digest, text in new:
                self._execute(
                    "INSERT INTO fingerprint_rules (digest, rule, first_seen) VALUES (?, ?, ?) "
                    "ON CONFLICT (digest) DO NOTHING",
                    (digest, text, at),
                )

    def fingerprint_versions(self) -> list[Held]:
        """
        The versions that can still answer a retry: receipts of an earlier scheme in any
        state but `rejected` (unresolved ones block, successes replay, `not_sent` and
        `safe_to_retry` lend their key), and unresolved receipts of any scheme (an edited
        rule's). Two grouped reads: the first over the partial index of earlier schemes
        (empty on a store that never held one), the second over the few unresolved receipts.
        """
        group = "api, operation, fingerprint_scheme, fingerprint_rule, state"
        select = f"SELECT {group}, COUNT(*) AS n, MAX(updated_at) AS last, MAX(operation_id) AS newest FROM receipts"
        rows = self._rows(f"{select} WHERE {_EARLIER_SCHEME} AND state != ? GROUP BY {group}", (State.REJECTED,))
        unresolved = sorted(UNRESOLVED)
        rows += self._rows(
            f"{select} WHERE state IN ({marks(len(unresolved))}) AND NOT {_EARLIER_SCHEME} GROUP BY {group}",
            unresolved,
        )
        digests = sorted({r["fingerprint_rule"] for r in rows if r["fingerprint_rule"]})
        rules: dict[str, dict[str, Any]] = {}
        if digests:
            sql = f"SELECT digest, rule FROM fingerprint_rules WHERE digest IN ({marks(len(digests))})"
            rules = {r["digest"]: json.loads(r["rule"]) for r in self._rows(sql, digests)}
        return [
            Held(
                api=r["api"],
                operation=r["operation"],
                scheme=r["fingerprint_scheme"],
                rule_digest=r["fingerprint_rule"],
                rule=rules.get(r["fingerprint_rule"]) if r["fingerprint_rule"] else None,
                state=state_of(r["state"], f"receipts of {r['api']} {r['operation']}"),
                count=r["n"],
                last_updated=r["last"],
                newest=r["newest"],
            )
            for r in rows
        ]
