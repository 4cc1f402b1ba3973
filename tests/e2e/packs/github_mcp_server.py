"""
A fake of GitHub's official MCP server (github/github-mcp-server) for the tests of
rules/github-mcp.yaml: the SDK's MCPServer on 127.0.0.1 over Streamable HTTP at /mcp/ (the
remote server's path), serving the pack's tools with the names, input schemas, annotations and
_meta published in tests/e2e/packs/github_mcp_tools.py, and answering as the real server does:

- success: one text content item holding JSON, no structuredContent: {"id": "<string>",
  "url": "<html_url>"} for an issue, a comment or a pull request, the contents API's
  {"content", "commit"} for a file;
- every failure a tool result with isError: true and one text, in the server's frame
  "<what failed>: <METHOD> <URL>: <status> <message> <errors>" (go-github's ErrorResponse);
  a second open pull request for the same head and base gets GitHub's 422 "A pull request
  already exists for <owner>:<head>.", as GitHub does;
- create_or_update_file as repositories.go @ 803f9803: a stale sha → "SHA mismatch: ..." without
  writing; no sha on an existing file → overwritten, the JSON after a "Warning: File updated
  without SHA validation..." text;
- reads: list_issues {"issues": [...], "totalCount", "pageInfo"} newest first,
  list_pull_requests [...] (filtered by state, head "owner:branch", base), issue_read
  get_comments [...] (oldest first).

    python -m tests.e2e.packs.github_mcp_server --port 0     # prints: github_mcp_server: ready http://127.0.0.1:PORT/mcp/

Faults, per call: POST /_faults {"tool": <name>, "when": {<argument>: <value>, ...}, "fault": F}
applies F to the next call of that tool whose arguments hold those values (once):
    {"kind": "drop"}                        the effect is recorded, then the answer starts and the
                                            connection is cut before it is complete
    {"kind": "github", "status": 422}       GitHub's answer with that status: a tool error in the
                                            server's text; nothing recorded
    {"kind": "github", "status": 502, "commit": true}
                                            the effect is recorded, then the tool error (GitHub
                                            answered 502 after acting: it happens)
    {"kind": "text", "text": "..."}         a tool error with this text, nothing sent to GitHub (the
                                            MCP App form: "An interactive form has been shown...")
    {"kind": "reaction_fails", "comment_first": bool}
                                            add_issue_comment: the reaction fails (GitHub's 422),
                                            after the comment (@009bb7b5's order) or before it
                                            (@03d3cfd1's order, where nothing is made)
Control (plain HTTP, never through the proxy): GET /_effects {"issues", "comments", "pulls",
"files", "updates", "reactions", "calls": [{"tool", "arguments", "authorization"}]}; POST /_reset.
The responses are the SDK's default (json_response off): SSE in the legacy revision, JSON for a
quick tool in 2026-07-28.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import threading
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent
from mcp_types import Tool as MCPTool

from tests.e2e.mcp.server import read_body, replaying, serve
from tests.e2e.packs.github_mcp_tools import TOOLS

PATH = "/mcp/"
TOOLSET = re.compile(r"/mcp/x/[a-z_]+/?")  # the remote server's toolset URLs, served here as PATH
API = "https://api.github.com"
MESSAGES = {
    400: "Bad Request",
    401: "Bad credentials",
    403: "Resource not accessible by integration",
    404: "Not Found",
    409: "Conflict",
    410: "Issues are disabled for this repo",
    422: "Validation Failed",
    500: "Internal Server Error",
    502: "Server Error",
    503: "Service Unavailable",
}


class State:
    """What the fake GitHub holds and what reached it. Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.issues: list[dict[str, Any]] = []
        self.comments: list[dict[str, Any]] = []
        self.pulls: list[dict[str, Any]] = []
        self.files: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self.reactions: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.pending: dict[str, dict[str, Any]] = {}  # a fault taken for a call, for its tool to apply
        self.next_id = 1000

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def fault_for(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        for i, f in enumerate(self.faults):
            if f["tool"] == tool and all(arguments.get(k) == v for k, v in f["when"].items()):
                return self.faults.pop(i)["fault"]
        return None

    def snapshot(self) -> dict[str, Any]:
        return {
            k: json.loads(json.dumps(getattr(self, k)))
            for k in ("issues", "comments", "pulls", "files", "updates", "reactions", "calls", "faults")
        }


STATE = State()


def _text(doc: Any, prefix: str = "") -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=prefix + json.dumps(doc))])


def _error(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def github_error(what: str, method: str, url: str, status: int, errors: str = "[]") -> str:
    """The server's text for a GitHub refusal: "<what failed>: <METHOD> <URL>: <status> <message> <errors>"."""
    return f"{what}: {method} {url}: {status} {MESSAGES.get(status, 'Error')} {errors}"


# What each write does: (the error prefix, the method, the GitHub path, the effect).
def _create_issue(a: dict[str, Any]) -> dict[str, Any]:
    n = len([i for i in STATE.issues if (i["owner"], i["repo"]) == (a["owner"], a["repo"])]) + 1
    issue = {
        "owner": a["owner"],
        "repo": a["repo"],
        "number": n,
        "id": STATE.new_id(),
        "title": a.get("title", ""),
        "body": a.get("body", ""),
        "state": "OPEN",
        "user": {"login": "octo-bot"},
        "created_at": f"2026-11-30T10:{n % 60:02d}:00Z",
    }
    STATE.issues.append(issue)
    return {"id": str(issue["id"]), "url": f"https://github.com/{a['owner']}/{a['repo']}/issues/{n}"}


def _create_comment(a: dict[str, Any]) -> dict[str, Any]:
    cid = STATE.new_id()
    url = f"https://github.com/{a['owner']}/{a['repo']}/issues/{a['issue_number']}#issuecomment-{cid}"
    STATE.comments.append(
        {
            "owner": a["owner"],
            "repo": a["repo"],
            "issue_number": a["issue_number"],
            "id": cid,
            "body": a.get("body", ""),
            "html_url": url,
            "user": {"login": "octo-bot"},
            "created_at": "2026-11-30T10:05:00Z",
        }
    )
    return {"id": str(cid), "url": url}


def _create_pull(a: dict[str, Any]) -> dict[str, Any]:
    n = 100 + len(STATE.pulls) + 1
    pid = STATE.new_id()
    STATE.pulls.append(
        {
            "owner": a["owner"],
            "repo": a["repo"],
            "number": n,
            "id": pid,
            "title": a["title"],
            "state": "open",
            "draft": bool(a.get("draft")),
            "merged": False,
            "html_url": f"https://github.com/{a['owner']}/{a['repo']}/pull/{n}",
            "head": {"ref": a["head"], "sha": "d" * 40},
            "base": {"ref": a["base"], "sha": "e" * 40},
        }
    )
    return {"id": str(pid), "url": f"https://github.com/{a['owner']}/{a['repo']}/pull/{n}"}


def blob_sha(content: str) -> str:
    data = content.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def current_file(a: dict[str, Any]) -> dict[str, Any] | None:
    key = (a["owner"], a["repo"], a["branch"], a["path"])
    found = [f for f in STATE.files if (f["owner"], f["repo"], f["branch"], f["path"]) == key]
    return found[-1] if found else None


def _put_file(a: dict[str, Any]) -> dict[str, Any]:
    commit = f"{STATE.new_id():040x}"
    STATE.files.append(
        {k: a.get(k) for k in ("owner", "repo", "branch", "path", "content", "message", "sha")}
        | {"commit": commit, "blob": blob_sha(a["content"])}
    )
    name = a["path"].rsplit("/", 1)[-1]
    return {
        "content": {
            "name": name,
            "path": a["path"],
            "sha": blob_sha(a["content"]),
            "html_url": f"https://github.com/{a['owner']}/{a['repo']}/blob/{a['branch']}/{a['path']}",
        },
        "commit": {"sha": commit, "html_url": f"https://github.com/{a['owner']}/{a['repo']}/commit/{commit}"},
    }


def _update_issue(a: dict[str, Any]) -> dict[str, Any]:
    STATE.updates.append(dict(a))
    return {
        "id": str(STATE.new_id()),
        "url": f"https://github.com/{a['owner']}/{a['repo']}/issues/{a.get('issue_number')}",
    }


WRITES = {
    "create_issue": ("failed to create issue", "POST", "/repos/{owner}/{repo}/issues", _create_issue),
    "add_issue_comment": (
        "failed to create comment",
        "POST",
        "/repos/{owner}/{repo}/issues/{issue_number}/comments",
        _create_comment,
    ),
    "create_pull_request": ("failed to create pull request", "POST", "/repos/{owner}/{repo}/pulls", _create_pull),
    "create_or_update_file": (
        "failed to create/update file",
        "PUT",
        "/repos/{owner}/{repo}/contents/{path}",
        _put_file,
    ),
    "update_issue": ("failed to update issue", "PATCH", "/repos/{owner}/{repo}/issues/{issue_number}", _update_issue),
}
REQUIRED = {
    "create_issue": ("owner", "repo", "title"),
    "add_issue_comment": ("owner", "repo", "issue_number"),
    "create_pull_request": ("owner", "repo", "title", "head", "base"),
    "create_or_update_file": ("owner", "repo", "path", "content", "message", "branch"),
    "update_issue": ("owner", "repo", "issue_number"),
}


def _comment(a: dict[str, Any], fault: dict[str, Any] | None) -> CallToolResult:
    """add_issue_comment: a comment and/or a reaction (to the issue, or with comment_id to a comment, as the
    newer server takes it). The order differs between versions: @009bb7b5 makes the comment first, @03d3cfd1
    the reaction first; a fault {"kind": "reaction_fails", "comment_first": bool} fails the reaction."""
    for name in REQUIRED["add_issue_comment"]:
        if name not in a:
            return _error(f"missing required parameter: {name}")
    if "body" not in a and "reaction" not in a:
        return _error("at least one of body or reaction is required")
    comment_first = bool(fault and fault.get("comment_first"))
    made: dict[str, Any] = {}
    if "body" in a and comment_first:
        made["comment"] = _create_comment(a)
    if "reaction" in a:
        target = f"comments/{a['comment_id']}" if "comment_id" in a else str(a["issue_number"])
        url = f"{API}/repos/{a['owner']}/{a['repo']}/issues/{target}/reactions"
        if fault and fault["kind"] == "reaction_fails":
            what = "failed to add reaction to issue comment" if "comment_id" in a else "failed to add reaction to issue"
            return _error(github_error(what, "POST", url, 422))
        rid = STATE.new_id()
        STATE.reactions.append({k: a.get(k) for k in ("owner", "repo", "issue_number", "comment_id", "reaction")})
        made["reaction"] = {"id": str(rid), "url": f"{url}/{rid}"}
    if "body" in a and not comment_first:
        made["comment"] = _create_comment(a)
    return _text(made if len(made) == 2 else next(iter(made.values())))


def _write(kind: str, a: dict[str, Any], fault: dict[str, Any] | None) -> CallToolResult:
    for name in REQUIRED[kind]:
        if name not in a:
            return _error(f"missing required parameter: {name}")
    what, method, path, effect = WRITES[kind]
    url = API + path.format(**{k: a.get(k) for k in ("owner", "repo", "issue_number", "path")})
    if kind == "create_pull_request" and any(
        p["state"] == "open"
        and (p["owner"], p["repo"], p["head"]["ref"], p["base"]["ref"]) == (a["owner"], a["repo"], a["head"], a["base"])
        for p in STATE.pulls
    ):
        return _error(
            github_error(
                what,
                method,
                url,
                422,
                "[{Resource:PullRequest Field: Code:custom "
                f"Message:A pull request already exists for {a['owner']}:{a['head']}.}}]",
            )
        )
    if fault and fault["kind"] == "github":
        if fault.get("commit"):
            effect(a)
        return _error(github_error(what, method, url, int(fault["status"])))
    if fault and fault["kind"] == "text":  # the server answers this text without calling GitHub (the MCP App form)
        return _error(fault["text"])
    if kind == "create_or_update_file" and (existing := current_file(a)):
        # repositories.go @ 803f9803: a given sha is checked first; none: the file is overwritten, with a warning.
        if a.get("sha") and a["sha"] != existing["blob"]:
            return _error(
                f"SHA mismatch: provided SHA {a['sha']} is stale. Current file SHA is {existing['blob']}. "
                "Use get_file_contents or compare commits to review changes before updating."
            )
        if not a.get("sha"):
            return _text(
                effect(a),
                prefix=(
                    f"Warning: File updated without SHA validation. Previous file SHA was {existing['blob']}. "
                    "Verify no unintended changes were overwritten: \n1. Extract the SHA of the local version using "
                    f"git ls-tree HEAD {a['path']}.\n2. Compare with the previous SHA above.\n3. Revert changes if "
                    "shas "
                    "do not match.\n\n"
                ),
            )
    return _text(effect(a))


def _read(tool: str, a: dict[str, Any]) -> CallToolResult:
    repo = (a.get("owner"), a.get("repo"))
    if tool == "list_issues":
        found = [i for i in STATE.issues if (i["owner"], i["repo"]) == repo]
        found.sort(key=lambda i: i["number"], reverse=a.get("direction", "DESC") == "DESC")
        found = found[: int(a.get("perPage", 30))]
        shown = [{k: i[k] for k in ("number", "title", "body", "state", "user", "created_at")} for i in found]
        return _text(
            {
                "issues": shown,
                "totalCount": len(shown),
                "pageInfo": {"hasNextPage": False, "hasPreviousPage": False, "startCursor": "", "endCursor": ""},
            }
        )
    if tool == "list_pull_requests":
        found = [
            p
            for p in STATE.pulls
            if (p["owner"], p["repo"]) == repo
            and a.get("state", "open") in ("all", p["state"])
            and (not a.get("head") or a["head"] == f"{p['owner']}:{p['head']['ref']}")
            and (not a.get("base") or a["base"] == p["base"]["ref"])
        ]
        return _text([{k: v for k, v in p.items() if k not in ("owner", "repo", "id")} for p in found])
    if tool == "issue_read":
        if a.get("method") != "get_comments":
            return _error(f"unsupported method in this fake: {a.get('method')}")
        if not isinstance(a.get("issue_number"), int | float):
            return _error("missing required parameter: issue_number")
        found = [c for c in STATE.comments if (c["owner"], c["repo"], c["issue_number"]) == (*repo, a["issue_number"])]
        return _text([{k: c[k] for k in ("id", "body", "html_url", "user", "created_at")} for c in found])
    return _error(f"unknown tool {tool}")


class GitHubMCP(MCPServer):
    """The published tools (TOOLS) served as they are: list_tools and call_tool overridden."""

    async def list_tools(self) -> list[MCPTool]:
        return [
            MCPTool.model_validate({k: v for k, v in t.items() if k not in ("source", "note")}) for t in TOOLS.values()
        ]

    def _tool_input_schema(self, name: str) -> dict[str, Any] | None:
        return TOOLS[name]["inputSchema"] if name in TOOLS else None

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> CallToolResult:
        with STATE.lock:
            fault = STATE.pending.pop(name, None)
            if name == "issue_write":
                kind = {"create": "create_issue", "update": "update_issue"}.get(arguments.get("method", ""))
                if kind is None:
                    return _error("missing required parameter: method")
                return _write(kind, arguments, fault)
            if name == "add_issue_comment" and (fault is None or fault["kind"] != "github"):
                return _comment(arguments, fault)
            if name in WRITES:
                return _write(name, arguments, fault)
            return _read(name, arguments)


class FaultsAndEffects:
    """ASGI wrapper: the control endpoints, a record of each tools/call, the faults (drop: here)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and TOOLSET.fullmatch(scope["path"]):  # /mcp/x/{toolset}: every tool here
            scope = {**scope, "path": PATH, "raw_path": PATH.encode()}
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            if scope["type"] == "http" and scope["path"] in ("/_effects", "/_faults", "/_reset"):
                return await self.control(scope, receive, send)
            return await self.app(scope, receive, send)
        raw = await read_body(receive)
        try:
            msg = json.loads(raw)
        except ValueError:
            msg = None
        fault = None
        if isinstance(msg, dict) and msg.get("method") == "tools/call" and isinstance(msg.get("params"), dict):
            name, arguments = msg["params"].get("name"), msg["params"].get("arguments") or {}
            auth = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            with STATE.lock:
                STATE.calls.append({"tool": name, "arguments": arguments, "authorization": auth})
                fault = STATE.fault_for(name, arguments)
                if fault and fault["kind"] != "drop":
                    STATE.pending[name] = fault
        replay = replaying(raw, receive)

        if not fault or fault["kind"] != "drop":
            return await self.app(scope, replay, send)
        held: list[dict] = []

        async def hold(message):
            held.append(message)

        await self.app(scope, replay, hold)  # the tool runs: the effect is recorded
        start = next(m for m in held if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in held if m["type"] == "http.response.body")
        ctype = dict(start.get("headers", [])).get(b"content-type", b"application/json")
        headers = [(b"content-type", ctype)]
        headers += (
            [(b"cache-control", b"no-cache")]
            if ctype.startswith(b"text/event-stream")
            else [(b"content-length", str(len(body)).encode())]
        )
        await send({"type": "http.response.start", "status": start["status"], "headers": headers})
        await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
        raise ConnectionAbortedError("drop: the connection cut after the effect")  # uvicorn closes it

    async def control(self, scope, receive, send):
        path, method = scope["path"], scope["method"]
        status, doc = 200, None
        if path == "/_effects" and method == "GET":
            with STATE.lock:
                doc = STATE.snapshot()
        elif path == "/_reset" and method == "POST":
            with STATE.lock:
                STATE.reset()
            doc = {"reset": True}
        elif path == "/_faults" and method == "POST":
            f = json.loads(await read_body(receive))
            with STATE.lock:
                STATE.faults.append({"tool": f["tool"], "when": f.get("when") or {}, "fault": f["fault"]})
            doc = {"queued": f}
        else:
            status, doc = 405, {"error": f"{method} {path} is not served"}
        body = json.dumps(doc).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="A fake of GitHub's MCP server (see tests/e2e/packs/github_mcp_server.py)"
    )
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = GitHubMCP("github-mcp-server", instructions="A fake of GitHub's MCP server for the pack's tests.")
    app = FaultsAndEffects(server.streamable_http_app(streamable_http_path=PATH))
    serve(app, port=args.port, ready=f"github_mcp_server: ready http://127.0.0.1:{{port}}{PATH}")


if __name__ == "__main__":
    main()
