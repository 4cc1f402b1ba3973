"""
MCP tool calls (the Streamable HTTP transport): every message is a JSON-RPC 2.0 POST to one
endpoint, and a tool call is the request `{"method": "tools/call", "params": {"name", "arguments"}}`.

    call = read_call(body, headers)          # ToolCall, Refused (headers disagree, a batch) or None
    doc = response_for(body, ctype, call.id) # the JSON-RPC response with the call's id (JSON or SSE)
    outcome = tool_outcome(...)              # that response → a receipt state (outcomes.py)
    answer = tool_answer(...)                # the proxy's own answer, as a result a model reads (answers.py)

Nothing here imports mitmproxy or the MCP SDK: the wire format is read and written as JSON.
"""

from proxy_addon.mcp.calls import Refused, ToolCall, decode_header_value, read_call
from proxy_addon.mcp.jsonrpc import framed, messages_of, response_for

__all__ = [
    "Refused",
    "ToolCall",
    "decode_header_value",
    "framed",
    "messages_of",
    "read_call",
    "response_for",
]
