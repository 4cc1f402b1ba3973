"""
`receipts rules explain`: what the proxy would do with a request, without sending it.

    report = explain(rules, "POST", "https://api.github.com/repos/o/r/issues", body, headers, key)
    print(render(report))

The report names the operation that matches (or why none does), the fields that enter the
fingerprint with their values (credentials never: they are shown as REDACTED), the fingerprint
itself, how an answer would be classified, what a duplicate would get and which of the rules'
decisions it gets. One module per part:

    report.py         the report, matched and fingerprinted exactly as the proxy does (`explain`)
    no_match.py       why no operation matches
    body_warnings.py  the fingerprint's named fields cannot be read from this body: why, what to change
    duplicates.py     what a duplicate gets, and what a reconcile read proves
    decision_trace.py which decision of the rules' `decisions:` it gets, and why
    render.py         the report as text (`render`)

An MCP tool call's part is explain/tool_calls.py's.
"""

from __future__ import annotations

from proxy_addon.explain.render import SHOWN, render
from proxy_addon.explain.report import BODY_LIMIT, explain

__all__ = ["BODY_LIMIT", "SHOWN", "explain", "render"]
