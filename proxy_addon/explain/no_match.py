"""
`receipts rules explain` for a request no operation matches: which rules files know its host,
and what each of their operations matches instead (method, path, letter case, GraphQL mutation,
MCP tool), so that a rule that was meant to match can be fixed.
"""

from __future__ import annotations

from proxy_addon.rules import ANY_TOOL, RuleSet
from proxy_addon.wire import gql
from proxy_addon.wire.canonical import canonical_host, canonical_path
from proxy_addon.wire.jsonpath import parse_json


def why_no_match(rules: RuleSet, host: str, port: int, method: str, path: str, body: bytes) -> list[str]:
    """Why no operation matched: which rules files know the host, and what they match instead."""
    files = rules.files_for(host, port)
    if not files:
        hosts = sorted({h for f in rules.files for h in f.hosts})
        return [
            f"no rules file names the host {canonical_host(host)} (the rules name: {', '.join(hosts) or 'none'})",
            "the proxy passes this request through untouched",
        ]
    lines = []
    bare = canonical_path(path).split("?")[0]
    tool = _tool_of(body) if any(op.mcp_tool == ANY_TOOL for f in files for op in f.operations) else None
    for f in files:
        lines.append(f"no operation of {f.api} ({f.source}) matches {method} {bare}:")
        mutation = gql.mutation_fields(body) if any(op.graphql for op in f.operations) else None
        for op in f.operations:
            why = ""
            if op.mcp_tool == ANY_TOOL and tool in op.mcp_read_tools and op.method == method:
                why = f"the tool {tool} is named a read in mcp.read_only_tools: its calls pass untouched"
            if why:
                pass
            elif op.method != method:
                why = f"method is {op.method}"
            elif op.path.match(bare) is None:
                why = "path differs"
                if op.path.fits_in_another_case(bare):
                    why += " in letter case only (paths are case-sensitive unless match.case_insensitive: true)"
            elif op.graphql:
                why = (
                    "the body is not a GraphQL mutation"
                    if mutation is None
                    else f"the mutation's root fields are {', '.join(mutation) or 'none'}, not {op.graphql}"
                )
            elif op.mcp_tool and op.mcp_tool != ANY_TOOL:
                named = ", ".join(f"{k}={v}" for k, v in op.mcp_arguments)
                why = f"the body is not a tools/call of {op.mcp_tool}" + (f" with {named}" if named else "")
            lines.append(
                f"  {op.name}: {op.method} {op.path.template}"
                + (f" (mutation {op.graphql})" if op.graphql else "")
                + (f" (MCP tool {op.mcp_tool})" if op.mcp_tool else "")
                + (f": {why}" if why else "")
            )
    lines.append("the proxy passes this request through untouched")
    return lines


def _tool_of(body: bytes) -> str | None:
    """The tool a tools/call body names, else None."""
    doc = parse_json(body) if body else None
    params = doc.get("params") if isinstance(doc, dict) and doc.get("method") == "tools/call" else None
    name = params.get("name") if isinstance(params, dict) else None
    return name if isinstance(name, str) else None
