"""
`receipts rules explain`'s text: `render(report)` prints the report report.py computes (its
`--json` prints the report itself). Values are shown up to SHOWN characters.
"""

from __future__ import annotations

import json
from typing import Any

from proxy_addon.explain.decision_trace import decision_lines
from proxy_addon.explain.tool_calls import tool_call_lines

SHOWN = 120  # characters of a value shown


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"


def render(report: dict[str, Any]) -> str:
    lines = [report["request"]]
    if "canonical" in report:
        lines.append(f"  matched as {report['canonical']} (its canonical form; it is forwarded as written)")
    lines += [f"  {k}: {v}" for k, v in report["headers"].items()]
    if "body" in report:
        lines.append(f"  body: {report['body']}")
    if report["match"] is None:
        lines += ["", *report["why"], "", "Nothing was sent."]
        return "\n".join(lines)
    m = report["match"]
    lines += ["", f"operation: {m['api']} {m['operation']}  ({m['source']})"]
    if "refused" in report:
        lines += ["", f"the proxy refuses this request and sends nothing: {report['refused']}", "", "Nothing was sent."]
        return "\n".join(lines)
    if m["description"]:
        lines.append(f"  {m['description']}")
    if m["graphql"]:
        lines.append(f"  recognised by the mutation's root field {m['graphql']}")
    if m.get("mcp"):
        lines += tool_call_lines(m["mcp"])
    fp = report["fingerprint"]
    lines += ["", "fingerprint fields (nothing else of the request enters it):"]
    lines += [f"  {k} = {_short(v)}" for k, v in fp["fields"].items()] or ["  (none: the body is ignored)"]
    lines += [f"  note: {n}" for n in fp.get("notes", ())]
    lines += [f"  WARNING: {w}" for w in fp.get("warnings", ())]
    principal = fp["principal"]
    if principal == "anonymous":
        shown = "anonymous (no credential)"
    elif fp.get("unidentified"):
        shown = (
            f"{principal} (no credential tells this caller apart: a keyed hash of {', '.join(fp['unidentified'])}, "
            "so only a request with the same bytes there is a duplicate, and no success is replayed)"
        )
    else:
        shown = f"{principal} (a keyed hash of {', '.join(fp.get('credentials') or ['the credential'])})"
    lines.append(f"  principal = {shown}")
    lines += [f"fingerprint: {fp['value']}"]
    if "key_note" in report:
        lines.append(f"  ({report['key_note']})")
    if "existing" in report:
        e = report["existing"]
        lines.append(
            f"  the receipts database has {e['operation_id']} with this fingerprint: {e['state']} "
            f"(submitted {e['submitted_at']})"
        )
    if "decision" in report:
        lines += decision_lines(report["decision"])
    lines += ["", "answers:"] + [f"  {c}" for c in report["classify"]]
    if "external_id" in report:
        lines.append(f"  the created object's id: {report['external_id']}")
    if "identity" in report:
        lines += ["", f"identity: {report['identity']}"]
    lines += ["", "a duplicate:"] + [f"  {d}" for d in report["duplicates"]]
    lines += ["", "Nothing was sent."]
    return "\n".join(lines)
