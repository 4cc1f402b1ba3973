"""
The soak's invariants (bench/soak.py checks them once the run has settled), from what the upstreams
and the MCP server saw, and what the stores hold:

- extra effects: an intent whose upstream effects (commits on its path; issues with its title) are
  more than one. Must be 0.
- missing receipts: an intent whose writes the upstream saw (committed or not: every request that
  reached it) outnumber its receipts that may have been sent (any state but not_sent). Must be 0:
  each receipt is one attempt, forwarded at most once.
- left submitted: receipts still `submitted` once the run has settled. Must be 0.

Receipts are read with the store's own API (`open_store(...).list`), never with SQL here.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from bench.soak_load import Intent, McpIntent


@dataclass
class Findings:
    intents: int = 0
    effects: Counter = field(default_factory=Counter)  # effects per intent -> intents
    extra: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    submitted: list[str] = field(default_factory=list)
    states: dict[str, Counter] = field(default_factory=dict)  # store -> state -> receipts
    forwarded: int = 0  # writes the upstreams and the MCP server saw

    @property
    def ok(self) -> bool:
        return not (self.extra or self.missing or self.submitted)


def receipts_of(db: str) -> list:
    from proxy_addon.store import open_store

    store = open_store(db, create=False)
    try:
        return store.list(limit=None)
    finally:
        store.close()


def bucket_of(target: str) -> str:
    parts = urlsplit(target).path.split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "api" else ""


def check(
    intents: list[Intent], mcp_intents: list[McpIntent], upstreams: dict, mcp_effects: dict, dbs: dict[str, str]
) -> Findings:
    """The findings, from the intents sent, the upstreams (name -> Upstream), the MCP server's /_effects, the stores."""
    f = Findings(intents=len(intents) + len(mcp_intents))
    by_bucket: dict[tuple[str, str], list] = defaultdict(list)
    tool_calls: dict[str, list[tuple[str, object]]] = defaultdict(list)  # store -> (its intent as JSON, receipt)
    for store, db in dbs.items():
        receipts = receipts_of(db)
        f.states[store] = Counter(str(r.state) for r in receipts)
        for r in receipts:
            if r.state == "submitted":
                f.submitted.append(f"{store} {r.operation_id} {r.operation} {r.target} (instance {r.instance})")
            if r.api == "tracker":
                tool_calls[store].append((json.dumps(r.intent), r))
            else:
                by_bucket[(store, bucket_of(r.target))].append(r)
    for i in intents:
        up = upstreams.get(i.upstream)
        commits, seen = (effects_of(up, i), up.seen(i.path)) if up is not None else (0, 0)
        _judge(
            f,
            f"{i.store} {i.op} {i.bucket} ({i.fault}, sent {i.sends}x)",
            commits,
            seen,
            by_bucket.get((i.store, i.bucket), []),
        )
    issues = Counter(issue["title"] for issue in mcp_effects.get("issues", []))
    calls = Counter(
        (r.get("arguments") or {}).get("title")
        for r in mcp_effects.get("requests", [])
        if r.get("jsonrpc_method") == "tools/call" and r.get("tool") == "create_issue"
    )
    for m in mcp_intents:
        _judge(
            f,
            f"{m.store} mcp {m.title} ({m.fault or 'ok'})",
            issues[m.title],
            calls[m.title],
            [r for text, r in tool_calls[m.store] if m.title in text],
        )
    return f


def committed(fault: str | None) -> bool:
    """Whether tests/upstream.py committed a write that met `fault` (as its do_POST decides)."""
    fault = fault or "ok"
    return fault not in ("lost", "commit_late") and (not fault.isdigit() or int(fault) >= 500)


def effects_of(up, intent: Intent) -> int:
    """
    The intent's effects on the upstream: its path's commits; for an operation with an idempotency key
    (payments), its distinct keys among them. The proxy resends an unknown outcome of such a write with
    the same key (docs/rules.md, `idempotency_key`), and the API it is for deduplicates by that key
    (Stripe); the test upstream commits every request, so the API's effects are counted here.
    """
    if intent.op != "payments":
        return up.commits(intent.path)
    with up.lock:
        keys = {
            next((v for k, v in r["headers"].items() if k.lower() == "idempotency-key"), None)
            for r in up.requests
            if r["method"] == "POST" and up.route(r["path"]) == intent.path and committed(r["fault"])
        }
    return len(keys)


def _judge(f: Findings, name: str, effects: int, seen: int, receipts: list) -> None:
    f.effects[effects] += 1
    f.forwarded += seen
    if effects > 1:
        f.extra.append(f"{name}: {effects} upstream effects")
    sendable = [r for r in receipts if r.state != "not_sent"]
    if seen > len(sendable):
        states = ", ".join(str(r.state) for r in receipts) or "none"
        f.missing.append(
            f"{name}: the upstream saw {seen} writes, {len(sendable)} receipts may have sent one (receipts: {states})"
        )


def submitted_count(dbs: dict[str, str]) -> int:
    """Receipts in `submitted` across the stores (a store that cannot be read counts as unsettled: -1)."""
    from proxy_addon.states import State
    from proxy_addon.store import open_store

    total = 0
    for db in dbs.values():
        try:
            store = open_store(db, create=False)
        except Exception:
            return -1
        try:
            total += len(store.list(states=[State.SUBMITTED], limit=None))
        except Exception:
            return -1
        finally:
            store.close()
    return total
