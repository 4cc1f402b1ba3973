"""
Which earlier fingerprints a request is looked up under, so that an upgrade or an edited rule
never turns a retry into a new write.

A fingerprint is made by a scheme (fingerprint.SCHEME: how a request is read, which changes
with receipt-proxy's versions) from a rule (Operation.fingerprint_rule: which fields and
credentials the user named). Every receipt records both. When the store still holds receipts
made by another version that can answer a retry, the request is fingerprinted under that
version too, and the store finds them by any of those fingerprints (store/attempts.py):

- **An earlier scheme** (an upgrade), under the same rule: the same intent, in every state. An
  unresolved receipt blocks the retry, a success is replayed (within `replay_window`, or
  always under `after_success: block`), and a `not_sent` or `safe_to_retry` one lends the retry
  its idempotency key. Receipts from before schemes were recorded may be scheme 1 (up to
  commit dc97d6d) or 2: both are computed.
- **An edited rule**: only while the receipt is unresolved. The edit says what the user now
  calls one intent, so a success under the old rule is not replayed to a request the new
  rule tells apart; but a write whose outcome is unknown keeps blocking its retries until it
  is resolved, since the retry may repeat it.

    versions = Versions.of(store.fingerprint_versions(), rules.operation, now=now, replay_window=86400)
    for version in versions.of_operation(op): ...     # fingerprint.build_attempt computes them

`Versions.of` also says what it could not cover (`unmatched`: receipts of operations the
rules no longer have; `unreadable`: an edited rule whose old description the store lacks), for
a warning at each rules load. Nothing here runs SQL or imports mitmproxy.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from proxy_addon.rules import Operation
from proxy_addon.states import UNRESOLVED, State
from proxy_addon.store import Held

LEGACY_SCHEMES = (1, 2)  # what a receipt made before schemes were recorded may have been made with


@dataclass(frozen=True)
class Version:
    """One earlier way to fingerprint an operation's requests."""

    scheme: int
    rule: dict[str, Any] | None  # an earlier rule's description; None: the operation's rule as it is now
    unresolved_only: bool  # its receipts count only while unresolved (an edited rule)


@dataclass(frozen=True)
class Versions:
    """The earlier versions to compute, per operation, and what could not be covered."""

    by_operation: dict[tuple[str, str], tuple[Version, ...]] = field(default_factory=dict)
    unmatched: tuple[Held, ...] = ()  # unresolved receipts of operations the rules no longer have
    unreadable: tuple[Held, ...] = ()  # unresolved receipts of an edited rule whose old description is lost
    edited: tuple[Held, ...] = ()  # unresolved receipts made under an earlier rule (still blocking)

    def of_operation(self, op: Operation) -> tuple[Version, ...]:
        return self.by_operation.get((op.api, op.name), ())

    def warnings(self) -> list[str]:
        """What a rules load should say aloud: unresolved receipts the rules in force treat otherwise."""
        lines = []
        for h, says in (
            *(
                (
                    h,
                    "were made under an earlier version of its rule's fingerprint: their retries are still "
                    "recognised under it, and blocked until they are resolved",
                )
                for h in _merged(self.edited)
            ),
            *(
                (
                    h,
                    "belong to an operation the rules no longer have: their retries pass through with no receipt; "
                    "restore the operation, or resolve them (receipts resolve)",
                )
                for h in _merged(self.unmatched)
            ),
            *(
                (
                    h,
                    "were made under an earlier rule this store has no description of: their retries are not "
                    "recognised; resolve them (receipts resolve)",
                )
                for h in _merged(self.unreadable)
            ),
        ):
            lines.append(
                f"{h.api} {h.operation}: {h.count} unresolved receipt{'s' if h.count != 1 else ''} (newest {h.newest}) "
                f"{says}. List them: receipts list --operation {h.api}/{h.operation} --state outcome_unknown "
                "--state submitted --state reconciling --state manual_review --state awaiting_approval"
            )
        return lines

    @classmethod
    def of(
        cls,
        held: Iterable[Held],
        operation: Callable[[str, str], Operation | None],
        *,
        now: dt.datetime,
        replay_window: float,
        current: int,
    ) -> Versions:
        """From what the store holds (`store.fingerprint_versions()`) and the rules in force."""
        found: dict[tuple[str, str], dict[tuple[int, str | None], bool]] = {}
        rules: dict[str | None, dict[str, Any] | None] = {}
        unmatched: list[Held] = []
        unreadable: list[Held] = []
        edited: list[Held] = []
        for h in held:
            op = operation(h.api, h.operation)
            if op is None:
                if h.state in UNRESOLVED:
                    unmatched.append(h)
                continue
            rule_changed = h.rule_digest is not None and h.rule_digest != op.rule_digest
            if rule_changed and h.rule is None:
                if h.state in UNRESOLVED:
                    unreadable.append(h)
                continue
            if rule_changed and h.state in UNRESOLVED:
                edited.append(h)
            if not _can_answer(op, h, rule_changed, now, replay_window):
                continue
            digest = h.rule_digest if rule_changed else None
            rules[digest] = h.rule if rule_changed else None
            for scheme in LEGACY_SCHEMES if h.scheme is None else (h.scheme,):
                if scheme == current and not rule_changed:
                    continue  # today's version: the fingerprint itself
                found.setdefault((op.api, op.name), {})[(scheme, digest)] = rule_changed  # only while unresolved
        return cls(
            by_operation={
                name: tuple(
                    Version(scheme, rules[digest], only) for (scheme, digest), only in sorted(v.items(), key=_order)
                )
                for name, v in found.items()
            },
            unmatched=tuple(unmatched),
            unreadable=tuple(unreadable),
            edited=tuple(edited),
        )


def _merged(held: Iterable[Held]) -> list[Held]:
    """One Held per operation: the counts of its versions and states added up, the newest id kept."""
    merged: dict[tuple[str, str], Held] = {}
    for h in held:
        m = merged.get((h.api, h.operation))
        merged[(h.api, h.operation)] = (
            h if m is None else replace(m, count=m.count + h.count, newest=max(m.newest, h.newest))
        )
    return list(merged.values())


def _order(item: tuple[tuple[int, str | None], bool]) -> tuple[int, str]:
    (scheme, digest), _ = item
    return (-scheme, digest or "")  # the newest scheme first: the likeliest to have made a receipt


def _can_answer(op: Operation, h: Held, rule_changed: bool, now: dt.datetime, replay_window: float) -> bool:
    """Whether receipts like `h` can still answer a retry of `op` (see the module docstring)."""
    if h.state in UNRESOLVED:
        return True
    if rule_changed:
        return False
    if h.state is State.SUCCEEDED:
        if op.after_success == "block":
            return True
        if op.after_success == "allow":
            return False
        last = dt.datetime.fromisoformat(h.last_updated.replace("Z", "+00:00"))
        return (now - last).total_seconds() <= replay_window
    if h.state in (State.NOT_SENT, State.SAFE_TO_RETRY):  # lends its idempotency key to the retry
        return op.idempotency_header is not None or op.idempotency_body is not None
    return False
