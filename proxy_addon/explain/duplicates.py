"""
`receipts rules explain`: what a duplicate of a matched write would get, by the state of the
first attempt (unresolved, succeeded, refused), and after an unknown outcome: the idempotency
key the API deduplicates by, or the reconcile read and what it proves (how its list is paged).
"""

from __future__ import annotations

from proxy_addon.rules import Operation, ReconcileSpec


def duplicates(op: Operation) -> list[str]:
    after = {
        "replay": "answered with the recorded response (within receipts_replay_window), never sent again"
        if op.record
        else "blocked with 409 duplicate_succeeded (record: false keeps no answer to replay), never sent again",
        "block": "blocked with 409 duplicate_succeeded, never sent again",
        "allow": "sent again as a new attempt",
    }[op.after_success]
    lines = [
        "while the first attempt is unresolved (submitted, outcome_unknown, reconciling, manual_review): "
        "blocked with 409 duplicate_unresolved",
        f"after it succeeded: {after}",
        "after it was rejected or provably not sent: sent again as a retry",
    ]
    spec = op.reconcile
    when = "after an unknown outcome"
    if op.idempotency_header:
        within = (
            f" while the API remembers the key ({op.idempotency_ttl}s from its first use)" if op.idempotency_ttl else ""
        )
        lines.append(
            f"{when}: sent again with the same {op.idempotency_header}{within}, "
            "which the API deduplicates (no read needed)"
        )
        if not op.idempotency_ttl:
            return lines
        when = "once the API has forgotten the key"
    if spec is None:
        lines.append(f"{when}: blocked until someone resolves it (no reconcile read in the rule)")
    else:
        absence = (
            "never proves absence: manual_review when not found"
            if not spec.absence_provable
            else (
                "proves absence"
                + (f" {spec.settle}s after the outcome became unknown" if spec.settle else " at once")
                + ("; then safe_to_retry" if spec.retry_when_absent else "; then manual_review (no retry_when_absent)")
            )
        )
        read = f"{spec.method} {spec.url}"
        if spec.tool is not None:
            read = (
                f"a call of the MCP tool {spec.tool} in the protocol revision the write was sent in (2026-07-28: "
                "no session; 2025-11-25: a session of its own; not noted: server/discover first) ("
                + (
                    "read-only by the rule's word"
                    if spec.tool_read_only
                    else "only if tools/list says readOnlyHint: true"
                )
                + ")"
            )
        lines.append(f"{when}: the duplicate triggers a read, {read}: found → succeeded; {absence}")
        pages = _pages(spec)
        if pages:
            lines.append(f"the read's list: {pages}")
    return lines


def _pages(spec: ReconcileSpec) -> str | None:
    """How the read's list continues (`reconcile.pages`), or None for a read that is no list."""
    pages = spec.pages
    if pages is None:
        if spec.complete_in_one_page:
            return "one page; the rule vouches that it holds every match (complete_in_one_page)"
        if not (spec.find or spec.items or spec.bounds):
            return None
        return (
            "one page (no pages declared); an answer that says there is more (has_more, a next cursor, "
            'a Link rel="next") proves nothing'
        )
    if pages.link:
        how = "follows the answer's Link rel=\"next\" (on the read's own origin)"
    else:
        where = f"the body field {pages.param}" if spec.body is not None else f"the query parameter {pages.param}"
        how = (
            f"while {pages.more} is true, the next page asks with {pages.from_} as {where}"
            if pages.more
            else f"while {pages.from_} has a value, the next page asks with it as {where}"
        )
    return (
        f"{how}, at most {pages.max} pages (pages.max); found on any page → succeeded, "
        '"not found" counts only when the walk reached the list\'s end (a walk cut at the max proves nothing)'
    )
