"""
The receipts story in mitmweb: a "Receipt" content view (commands are in mitm/flow_commands.py).

- The Receipt view shows a flow's receipt: state, fingerprint, sanitized intent (and how
  its body was read when not as the rule says: the fallback used, missing or hashed fields),
  event history, and the decisions applied to it (a rule's deny, a budget's refusal, an
  approval or a denial and who made it, what observe mode would have done, a resolution). An
  MCP tool call that waits shows for what: its client's input (and how many rounds its server
  asked for), or its task (the first characters of its id, its status).
  For a blocked or replayed duplicate it shows the original receipt. mitmproxy picks it by
  itself for the proxy's own answers (blocked, replayed, denied); for other matched flows
  choose "Receipt" in the body's view menu.
- `ReceiptWeb` is the small addon that registers the view when mitmproxy loads it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from mitmproxy import contentviews
from mitmproxy.addonmanager import Loader
from mitmproxy.contentviews import Metadata

from proxy_addon.intent.fingerprint import intent_notes
from proxy_addon.mitm.flows import meta_of
from proxy_addon.states import State
from proxy_addon.store import Event, Receipt, ReceiptStore
from proxy_addon.store.applied_decisions import applied_decisions

ANSWERED = ("blocked", "replay", "blocked_succeeded", "key_conflict", "denied", "over_budget")  # the proxy answered


def describe(store: ReceiptStore, operation_id: str, *, answer: str | None = None) -> str:
    """A receipt as readable text: its fields, intent and history."""
    r = store.get(operation_id)
    lines = []
    if answer in ANSWERED:
        if answer == "denied":
            lines += [f"This request was DENIED (receipt {r.operation_id}); it was not sent.", ""]
        elif answer == "over_budget":
            lines += [f"This request was OVER BUDGET (receipt {r.operation_id}); it was not sent.", ""]
        else:
            verb = "REPLAYED from" if answer == "replay" else "BLOCKED: a duplicate of"
            lines += [f"This request was {verb} receipt {r.operation_id} (now {r.state}); it was not sent.", ""]
    lines += _fields(r)
    if tool := r.intent.get("tool"):
        args = ", ".join(k.removeprefix("params.arguments.") for k in (r.intent.get("body") or {}))
        lines += [f"MCP tool call: {tool}({args})  (its JSON-RPC id and session are never stored)"]
    lines += ["", "intent (the allowlisted fields; credentials are never stored):"]
    lines += ["  " + line for line in json.dumps(r.intent, indent=2, sort_keys=True).splitlines()]
    if notes := intent_notes(r.intent):  # a fallback, missing or hashed fields: said, never silent
        lines += ["", 'how the body was read (docs/rules.md, "When the named fields are not there"):']
        lines += [f"  {n}" for n in notes]
    if waiting := _waiting(r):
        lines += ["", waiting]
    events = store.events(r.operation_id)
    lines += ["", "history:"]
    for e in events:
        lines.append(f"  {e.at}  {_change(e):36}  {e.actor:18}  {e.reason}")
    lines += ["", *_decisions(events)]
    return "\n".join(lines) + "\n"


def _decisions(events: list[Event]) -> list[str]:
    """The decisions applied to the receipt (store/applied_decisions.py): what, by whom; the why is its history line."""
    decisions = applied_decisions(events)
    if not decisions:
        return ["decisions: none"]
    return ["decisions:", *(f"  {d.at}  {d.decision:56}  {d.by}" for d in decisions)]


def _fields(r: Receipt) -> list[str]:
    rows = [
        ("receipt", r.operation_id),
        ("operation", f"{r.api} {r.operation}"),
        ("state", r.state),
        ("target", f"{r.method} {r.target}"),
        ("sent as", f"{r.method} {r.raw_target}" if r.raw_target else None),
        ("fingerprint", r.intent_fingerprint),
        ("submitted", r.submitted_at),
        ("completed", r.completed_at),
        ("http status", r.http_status),
        ("external id", r.external_id),
        ("error", r.error),
        ("retry of", r.retry_of),
        ("input rounds", r.mcp_rounds or None),  # how often its server asked for input (MCP input_required)
        ("task", _task(r)),
        ("idempotency key", r.idempotency_key),
        ("recorded answer", _answer(r)),
    ]
    return [f"{k:16} {v}" for k, v in rows if v not in (None, "")]


def _task(r: Receipt) -> str | None:
    if r.task_hint is None:
        return None
    return f"{r.task_hint} ({r.task_status or 'status unknown'}, {r.task_revision}; its full id is kept encrypted)"


def _change(e: Event) -> str:
    """An event as the history shows it: a transition, a duplicate's answer, or a step of a call that waits."""
    if e.event == "transition":
        return f"{e.from_state or '(new)'} → {e.to_state}"
    if e.event in ("blocked", "replayed"):
        return f"{e.event} duplicate"
    return {"input_required": "input required (round)", "continued": "next round sent", "task": "task"}.get(
        e.event, e.event
    )


def _waiting(r: Receipt) -> str | None:
    """What a submitted MCP tool call waits for, in words (store/rounds.py)."""
    if r.state is not State.SUBMITTED or r.waiting_for is None:
        return None
    if r.waiting_for == "input":
        until = f", until {r.waiting_until}" if r.waiting_until else ""
        return (
            f"WAITING FOR INPUT: its server asked for input ({r.mcp_rounds} round(s)); the call goes on when the "
            f"client sends its next round{until}. Nothing is in flight meanwhile."
        )
    return (
        f"WAITING FOR ITS TASK {r.task_hint} ({r.task_status or 'status unknown'}): the server runs the call as a "
        "task; the task's end decides the receipt (read as the client polls it, or by the proxy when a retry comes)."
    )


def _answer(r: Receipt) -> str | None:
    """What is known of the recorded answer without opening it: never its headers or body (store/sealing.py)."""
    a = r.response
    if a is None:
        return None
    kept = "encrypted" if a.encryption is not None else "in clear (recorded before answers were encrypted)"
    return f"HTTP {a.status}, {a.size} bytes, {kept}" + (", truncated: never replayed" if a.truncated else "")


class ReceiptView(contentviews.Contentview):
    """mitmproxy content view: the receipt behind a matched flow."""

    name = "Receipt"
    syntax_highlight = "yaml"

    def __init__(self, reader: Callable[[], ReceiptStore | None]):
        self.reader = reader

    def prettify(self, data: bytes, metadata: Metadata) -> str:
        meta = meta_of(metadata.flow)
        store = self.reader()
        if not meta or store is None:
            raise ValueError("this flow has no receipt")
        return describe(store, meta["operation_id"], answer=meta.get("answer"))

    def render_priority(self, data: bytes, metadata: Metadata) -> float:
        meta = meta_of(metadata.flow)
        if not meta:
            return -1
        return 2 if meta.get("answer") in ANSWERED else 0.05  # ours for the proxy's own answers; else by choice


class ReceiptWeb:
    """Registers the Receipt content view. mitmproxy 12 cannot unregister a view (contentviews.remove
    is a no-op); a reloaded script registers its view again under the same name, which replaces this one."""

    def __init__(self, reader: Callable[[], ReceiptStore | None]):
        self.view = ReceiptView(reader)

    def load(self, loader: Loader) -> None:
        contentviews.add(self.view)
