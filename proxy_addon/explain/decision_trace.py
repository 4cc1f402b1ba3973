"""
`receipts rules explain`'s part on an operation's `decisions:` (its own, then its file's): the
decision the request gets, and why: each entry tried in order, its line, the value each test read
and whether it held, up to the entry that decided (intent/decisions.py `trace`, as the proxy decides).

    describe_decisions(report, op, intent)   # report["decision"]; nothing for an operation without decisions
    lines = decision_lines(report["decision"])
"""

from __future__ import annotations

import json
from typing import Any

from proxy_addon.intent.decisions import MISSING, trace
from proxy_addon.intent.decisions import shown as shown_value
from proxy_addon.intent.fingerprint import Intent
from proxy_addon.rules import Operation

WIDTH = 120  # characters of a tested value shown
EFFECT = {
    "allow": "sent as usual",
    "approve": "held for an operator's approval (mitmweb, receipts approve) before it is sent",
    "deny": "answered 403 denied_by_policy and recorded rejected: nothing is sent",
}


def describe_decisions(report: dict[str, Any], op: Operation, intent: Intent) -> None:
    """The report's `decision` part, for an operation with decisions."""
    if not op.decisions:
        return
    verdict, tried = trace(op.decisions, intent.intent, intent.principal)
    report["decision"] = {
        "decision": verdict.decision,
        "why": verdict.why,
        "tried": [
            {
                "entry": ("the file's " if t.rule.in_file else "") + f"decisions[{t.rule.index}]",
                "line": t.rule.line,
                "decision": t.rule.decision,
                "held": t.held,
                "tests": [
                    {
                        "field": c.field,
                        "value": None if v is MISSING else v,
                        "missing": v is MISSING or v is None,  # absent, or null: passes no test
                        "test": f"{c.op} {shown_value(c.value)}",
                        "holds": ok,
                    }
                    for c, v, ok in t.tests
                ],
            }
            for t in tried
        ],
    }


def decision_lines(part: dict[str, Any]) -> list[str]:
    """The `decision` part as text: the decision and its effect, then each entry tried."""
    lines = ["", f"decision: {part['decision']}: {EFFECT[part['decision']]}", f"  {part['why']}"]
    for entry in part["tried"]:
        said = "holds: it decides" if entry["held"] else "does not hold"
        lines.append(f"  {entry['entry']} (line {entry['line']}) {entry['decision']}: {said}")
        for t in entry["tests"]:
            value = "missing or null (passes no test)" if t["missing"] else _short(t["value"])
            lines.append(f"    {t['field']} = {value}: {t['test']} {'holds' if t['holds'] else 'fails'}")
    return lines


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= WIDTH else text[: WIDTH - 1] + "…"
