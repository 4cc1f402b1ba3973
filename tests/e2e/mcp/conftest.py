"""The MCP fixtures (tests/e2e/mcp/fixtures.py) for every test here: `mcp_server` (both response modes),
`mcp_json_server`, `mcp_sse_server` and `bare_mitmdump`."""

from tests.e2e.mcp.fixtures import bare_mitmdump, mcp_json_server, mcp_server, mcp_sse_server

__all__ = ["bare_mitmdump", "mcp_json_server", "mcp_server", "mcp_sse_server"]
