"""
`receipts rules explain` for an MCP tool call: which tool, whether a rule names it or
`mcp.tools: from_server` derived it, how its answers are classified (with multi-round-trip
calls, input_required, and tasks), what a duplicate gets
(`describe_tool_call`, for explain/report.py), and those lines of the text (`tool_call_lines`,
for explain/render.py).
"""

from __future__ import annotations

from typing import Any

from proxy_addon.rules import ANY_TOOL, Operation


def describe_tool_call(report: dict[str, Any], op: Operation, tool: str, rules: list[str]) -> None:
    """An MCP tool call: which tool, whether the rule names it or `mcp.tools: from_server` derived it, its answers."""
    derived = op.mcp_tool == ANY_TOOL
    report["match"]["mcp"] = {"tool": tool, "derived": derived}
    if derived:
        if op.mcp_trusts_annotations:
            unless = (
                f"unless the server's tools/list (read as it passes the proxy) declares {tool} readOnlyHint: true, "
                "in which case the call passes untouched (mcp.annotations: trusted)"
            )
        else:
            unless = (
                "whatever the server's tools/list says of it: its annotations are not trusted (the MCP "
                f"specification calls them untrusted); name {tool} in mcp.read_only_tools if it only reads, or "
                "set mcp.annotations: trusted for a server you trust"
            )
        report["match"]["mcp"]["why"] = (
            f"no operation names the tool {tool}, and {op.source}:{op.line} says mcp.tools: from_server: a write, "
            f"fingerprinted on all its arguments, {unless}"
        )
    rules = [text.replace("→", "(the tool's result) →", 1) for text in rules]
    report["classify"] = [
        *rules,
        "a 2xx answer (JSON or an event stream) is read for the JSON-RPC response with the call's id: a result → "
        "succeeded; isError: true → rejected; an error raised before the tool runs (-32700, -32600 without an id, "
        "-32601, -32602, -32020, -32021, -32022) → rejected; any other error (-32603, -32600 under the call's id), "
        "or no response with that id → outcome_unknown",
        "another status: as any write (4xx → rejected, 5xx → outcome_unknown), but a 4xx whose JSON-RPC error is "
        "-32603 or -32600 under the call's id → outcome_unknown",
        "a result with resultType input_required (the server asks for input: elicitation, sampling, roots) is no "
        "outcome: the receipt stays submitted, waiting for the client's next round (the same call with requestState/"
        "inputResponses), which is sent under the same receipt and decides it; at most receipts_mcp_rounds rounds "
        "(past them: not sent, outcome_unknown), and a client that has not gone on after receipts_mcp_input_wait is "
        "taken as gone (outcome_unknown); the interim answer passes untouched and is never replayed",
        "a task handle (resultType task, or a 2025-11-25 task-augmented call's CreateTaskResult) is no outcome: the "
        "receipt stays submitted with the task's id (kept encrypted), and the task's end decides it, read from the "
        "tasks/get and tasks/result answers that pass the proxy, or by the proxy itself (tasks/get) when a duplicate "
        "comes: its result as any result (succeeded, recorded to replay; isError → rejected); a failed task's error "
        "as the call's error would be (one raised before the tool runs → rejected, else outcome_unknown); cancelled, "
        "or unknown to the server → outcome_unknown",
    ]
    report["duplicates"] = [
        d.replace(
            "blocked with 409 duplicate_unresolved",
            "blocked: HTTP 200 with an isError tool result saying "
            "why, for the model (the receipt id, what an operator can do)",
        ).replace(
            "answered with the recorded response",
            "answered with the recorded result under the duplicate's own JSON-RPC id",
        )
        for d in report["duplicates"]
    ] + [
        "while the first call waits for its client's input: refused at once (an isError tool result that says so), "
        "never made to wait for an outcome only that client can bring",
        "while the first call's task works: refused, with the task's id, for the model to poll it (after the proxy "
        "read the task itself: a task that ended settles the receipt first, and the duplicate gets that)",
    ]


def tool_call_lines(mcp: dict[str, Any]) -> list[str]:
    """The text of the report's `match.mcp` (describe_tool_call): the tool, and why it counts as a write if derived."""
    lines = [f"  the MCP tool call {mcp['tool']} (its JSON-RPC id and session never enter the fingerprint)"]
    if mcp["derived"]:
        lines.append(f"  derived: {mcp['why']}")
    return lines
