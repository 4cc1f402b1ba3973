"""
Two small upstreams on 127.0.0.1 that read JSON request bodies as Node and Go servers do, each
serving an MCP endpoint (`/mcp`, JSON-RPC) and a GraphQL endpoint (`/graphql`), and counting
the tool calls and mutations they run. Nothing here imports proxy_addon: they read bodies
their own way, as a real server would.

    with LenientServer("node") as up:        # or "go"
        ...POST up.url + "/mcp" through the proxy...
        assert up.runs() == []               # [("create_issue", {...}), ("issueCreate", {...})]

- **node**: the body is `Buffer.toString()`: UTF-8 with every invalid byte replaced by U+FFFD,
  then `JSON.parse`: a key twice, the last one counts; keys are case-sensitive.
- **go**: invalid UTF-8 inside strings is replaced by U+FFFD (encoding/json), and the fields of
  the structs a server decodes into (the JSON-RPC envelope, `params`, the tool's arguments, a
  GraphQL request's `query`/`variables`/`operationName`) take any key that matches them
  regardless of case, the last one counting: `"Method": "tools/call"` is the method.

A `tools/call` of `create_issue` runs (and is counted) however its arguments are spelled;
`initialize` and `tools/list` are answered; anything else gets a JSON-RPC error. A GraphQL
request runs the operation `operationName` names (or the only one): a mutation's root
`issueCreate` fields are counted. A body neither reads as JSON gets a parse error (-32700, or
HTTP 400 for GraphQL), and runs nothing.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from graphql import GraphQLError, parse
from graphql.language import FieldNode, OperationDefinitionNode, OperationType
from graphql.utilities import value_from_ast_untyped


class LenientServer:
    def __init__(self, flavour: str):
        assert flavour in ("node", "go"), flavour
        self.flavour = flavour
        self.lock = threading.Lock()
        self._runs: list[tuple[str, Any]] = []
        self.server: ThreadingHTTPServer | None = None

    # --- what it ran -------------------------------------------------------------------

    def runs(self) -> list[tuple[str, Any]]:
        with self.lock:
            return list(self._runs)

    def reset(self) -> None:
        with self.lock:
            self._runs.clear()

    def _ran(self, what: str, args: Any) -> int:
        with self.lock:
            self._runs.append((what, args))
            return len(self._runs)

    # --- reading a body as Node or Go does ------------------------------------------------

    def document(self, body: bytes) -> Any:
        """The body as this server's JSON decoder reads it (ValueError: it does not)."""
        text = body.decode("utf-8", "replace")  # both: an invalid byte is U+FFFD
        if self.flavour == "node":
            return json.loads(text)  # JSON.parse: the last of two keys counts
        return json.loads(text, object_pairs_hook=_Pairs)  # Go: keys matched to struct fields below

    def field(self, obj: Any, name: str) -> Any:
        """A struct field as the decoder fills it: Node by the exact key; Go by any case, the last key winning."""
        if isinstance(obj, _Pairs):
            found = None
            for k, v in obj:
                if k.casefold() == name.casefold():
                    found = v
            return found  # a struct again, or a value (as a map: _plain)
        return obj.get(name) if isinstance(obj, dict) else None

    # --- the server -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> LenientServer:
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.split("?")[0] == "/mcp":
                    status, answer = up.mcp(body)
                elif self.path.split("?")[0] == "/graphql":
                    status, answer = up.graphql(body)
                else:
                    status, answer = 404, {"error": "not found"}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def mcp(self, body: bytes) -> tuple[int, dict]:
        try:
            message = self.document(body)
        except ValueError:
            return 200, {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
        call_id, method, params = (self.field(message, k) for k in ("id", "method", "params"))
        if method == "initialize":
            return 200, {
                "jsonrpc": "2.0",
                "id": call_id,
                "result": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": self.flavour},
                },
            }
        if method == "tools/list":
            return 200, {
                "jsonrpc": "2.0",
                "id": call_id,
                "result": {"tools": [{"name": "create_issue", "inputSchema": {"type": "object"}}]},
            }
        if method == "tools/call" and self.field(params, "name") == "create_issue":
            arguments = self.field(params, "arguments") or {}
            title = self.field(arguments, "title")
            n = self._ran("create_issue", {"title": title})
            return 200, {
                "jsonrpc": "2.0",
                "id": call_id,
                "result": {"content": [{"type": "text", "text": f"created issue #{n}"}], "isError": False},
            }
        return 200, {"jsonrpc": "2.0", "id": call_id, "error": {"code": -32601, "message": "Method not found"}}

    def graphql(self, body: bytes) -> tuple[int, dict]:
        try:
            request = self.document(body)
            query = self.field(request, "query")
            variables = _plain(self.field(request, "variables")) or {}  # a map: its keys exact
            name = self.field(request, "operationName")
            document = parse(query)
        except (ValueError, TypeError, GraphQLError):
            return 400, {"errors": [{"message": "bad request"}]}
        ops = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
        op = (
            next((o for o in ops if o.name and o.name.value == name), None)
            if name
            else (ops[0] if len(ops) == 1 else None)
        )
        if op is None:
            return 400, {"errors": [{"message": "no operation to run"}]}
        data: dict[str, Any] = {}
        if op.operation is OperationType.MUTATION:
            for f in op.selection_set.selections:
                if isinstance(f, FieldNode) and f.name.value == "issueCreate":
                    args = {a.name.value: value_from_ast_untyped(a.value, variables) for a in f.arguments or ()}
                    data[f.alias.value if f.alias else "issueCreate"] = {"id": self._ran("issueCreate", args)}
        return 200, {"data": data}


class _Pairs(list):
    """A JSON object as Go's decoder meets it: its keys in order, matched to struct fields later."""


def _plain(value: Any) -> Any:
    """A value as a map or slice decodes it (exact keys, the last one counting)."""
    if isinstance(value, _Pairs):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
