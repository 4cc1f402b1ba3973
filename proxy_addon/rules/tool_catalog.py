"""
What MCP servers declare about their tools, learnt from the `tools/list` answers the proxy
passes (`mcp: {tools: from_server}`).

    catalog.learn(endpoint, result, first_page=True)  # a tools/list result: {"tools": [...], "nextCursor"}
    catalog.read_only(endpoint, "list_issues")          # True only if the server said readOnlyHint: true

Only `readOnlyHint: true` makes a tool a read: a tool the server has not listed (the agent
listed the tools before the proxy started, or never), or lists without that hint, is a write.
So what the catalog does not know errs toward a receipt, never toward an unrecorded write.

Bounded: at most MAX_ENDPOINTS endpoints (the least recently listed is forgotten) and
MAX_TOOLS tools each; a first page replaces what an endpoint had, later pages add to it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

MAX_ENDPOINTS = 64
MAX_TOOLS = 2048


class ToolCatalog:
    def __init__(self) -> None:
        self._endpoints: OrderedDict[str, dict[str, bool]] = OrderedDict()

    def learn(self, endpoint: str, result: Any, *, first_page: bool) -> int:
        """Take a tools/list result's tools; how many it named."""
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            return 0
        known = {} if first_page else self._endpoints.get(endpoint, {})
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            if len(known) >= MAX_TOOLS and tool["name"] not in known:
                break
            annotations = tool.get("annotations")
            known[tool["name"]] = isinstance(annotations, dict) and annotations.get("readOnlyHint") is True
        self._endpoints[endpoint] = known
        self._endpoints.move_to_end(endpoint)
        while len(self._endpoints) > MAX_ENDPOINTS:
            self._endpoints.popitem(last=False)
        return len(tools)

    def read_only(self, endpoint: str, tool: str) -> bool:
        return self._endpoints.get(endpoint, {}).get(tool, False)

    def tools(self, endpoint: str) -> dict[str, bool]:
        """The tools the endpoint listed, and whether each is read-only."""
        return dict(self._endpoints.get(endpoint, {}))
