"""
A tool call read from a request to an MCP endpoint, or why the proxy refuses the request.

    read_call(doc, headers)   # ToolCall, Refused, or None (not a tool call: passed untouched)

What is a tool call: a JSON-RPC request `{"jsonrpc": "2.0", "id", "method": "tools/call",
"params": {"name": <tool>, "arguments": {...}}}`. Everything else sent to the endpoint
(`initialize`, `server/discover`, `tools/list`, notifications, answers to the server's own
requests) is not, and passes untouched.

What is refused (never forwarded), on an endpoint a rule names:
- `Mcp-Method` or `Mcp-Name` headers (the 2026-07-28 revision sends them, for routing) that
  disagree with the body: a gateway routing by the headers and a server acting on the body
  would see two different calls, and the receipt would be for one of them;
- a JSON-RPC batch (a list) that holds a tool call: neither revision in use allows batches
  (2025-06-18 removed them), and a receipt is for one call; sent one by one, each gets its own;
- a tool call without an id, a tool name, or with arguments that are not an object;
- a body that is not strict UTF-8 JSON, or has a key twice in one object, or two keys that
  differ only by case anywhere, or an envelope or params key in another case (`"Method"`):
  Node's and Go's servers read such bodies (replacing bad bytes with U+FFFD; Go matching keys
  regardless of case, the last one winning) and run a call the proxy would not see
  (json_body.read_strict). These are refused as `bad_json` (`Refused.reason`), unless the
  body is an object with no `method` key in any spelling: the client's answer to a request
  of the server's (elicitation, sampling, roots), which no reader takes for a request, passes
  untouched whatever its result holds (`answer_of`).
The JSON-RPC `id` and `Mcp-Session-Id` never enter the intent: they change on every retry. Nor do
`requestState` and `inputResponses` (the next round of a call whose server asked for input: the
same write going on, `ToolCall.continues`) or `task` (a 2025-11-25 task-augmented call).
The protocol revision the call is sent in (`ToolCall.revision`: its MCP-Protocol-Version header,
else its `_meta`'s, when it is a date) is noted with the intent, never fingerprinted: a reconcile
read speaks it (reconcile/tool_reads.py).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy_addon.wire.json_body import NotStrict, misspelled, read_strict
from proxy_addon.wire.jsonpath import NOT_JSON, parse_json

_B64 = re.compile(r"=\?base64\?(?P<payload>.*)\?=")
_REVISION = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")  # a protocol revision is a date: anything else is not kept
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
# The keys the proxy reads of a JSON-RPC message and of its params: another spelling is refused.
ENVELOPE = frozenset({"jsonrpc", "id", "method", "params", "result", "error"})
PARAMS = frozenset({"name", "arguments", "_meta", "requestState", "inputResponses", "task"})


@dataclass(frozen=True)
class ToolCall:
    id: Any  # the JSON-RPC id: a string or a number, new on every retry
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    modern: bool = False  # the 2026-07-28 revision (routing headers or params._meta): results carry resultType
    revision: str | None = None  # the protocol revision it is sent in (MCP-Protocol-Version, else _meta), if a date
    # The next round of a call whose server asked for input (2026-07-28, multi-round-trip requests): it
    # carries `requestState` or `inputResponses` (store/rounds.py). Neither ever enters the intent.
    continues: bool = False
    task: bool = False  # a 2025-11-25 task-augmented call (`params.task`): its answer may be a task handle


@dataclass(frozen=True)
class Refused:
    why: str
    reason: str = "method_override_refused"  # the kind of refusal (metrics): bad_json for a body read two ways


def decode_header_value(value: str | None) -> str | None:
    """An `Mcp-Name` value: as sent, or its `=?base64?...?=` form decoded (None when that is malformed)."""
    if value is None:
        return None
    m = _B64.fullmatch(value)
    if m is None:
        return value
    try:
        decoded = base64.b64decode(m.group("payload"), validate=True)
        return decoded.decode("utf-8") if base64.b64encode(decoded).decode("ascii") == m.group("payload") else None
    except (binascii.Error, UnicodeDecodeError):
        return None


def read_call(doc: Any, headers: Mapping[str, str]) -> ToolCall | Refused | None:
    """The tool call a parsed JSON-RPC body makes (`parse_message`); `headers` with lower-case names."""
    if isinstance(doc, Refused):
        return doc
    method_header, name_header = headers.get("mcp-method"), headers.get("mcp-name")
    if isinstance(doc, list):
        if any(isinstance(m, dict) and m.get("method") == "tools/call" for m in doc):
            return Refused(
                "a JSON-RPC batch holding a tools/call: MCP allows no batches, and each call needs a receipt "
                "of its own; send the calls one by one"
            )
        return None
    if not isinstance(doc, dict):
        return None
    method = doc.get("method")
    if method_header is not None and method_header != method:
        return Refused(f"the Mcp-Method header says {method_header[:60]!r} but the body's method is {_short(method)}")
    if method != "tools/call":
        return None
    params = doc.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    if not isinstance(name, str) or not name:
        return Refused("a tools/call without a tool name (params.name)")
    if name_header is not None and decode_header_value(name_header) != name:
        return Refused(f"the Mcp-Name header does not name the body's tool {_short(name)}")
    assert isinstance(params, dict)
    arguments = params.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return Refused(f"tools/call {_short(name)} with arguments that are not an object")
    call_id = doc.get("id")
    if call_id is None or isinstance(call_id, bool) or not isinstance(call_id, (str, int, float)):
        return Refused(f"tools/call {_short(name)} without a JSON-RPC id (a notification gets no answer)")
    meta = params.get("_meta")
    modern = method_header is not None or (isinstance(meta, dict) and PROTOCOL_VERSION_META in meta)
    revision = revision_of(headers.get("mcp-protocol-version")) or revision_of(
        meta.get(PROTOCOL_VERSION_META) if isinstance(meta, dict) else None
    )
    continues = params.get("requestState") is not None or params.get("inputResponses") is not None
    return ToolCall(
        call_id, name, arguments, modern, revision, continues=continues, task=isinstance(params.get("task"), dict)
    )


def revision_of(value: Any) -> str | None:
    """A protocol revision as a request names it (`2026-07-28`), or None: a value that is not a date is never kept."""
    return value if isinstance(value, str) and _REVISION.fullmatch(value) else None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "...'"


def parse_message(body: bytes) -> Any:
    """
    A JSON-RPC body sent to an MCP endpoint, parsed once; Refused (reason `bad_json`) when it is
    not strict UTF-8 JSON, an object in it has a key twice or two keys that differ only by case,
    or its envelope or params spell a key in another case (module docstring). Parsers disagree
    on which of two keys counts: a body that names a read-only tool for the proxy could name a
    write for the server. So such a body is refused, never guessed.

    Unless it is the client's answer to a request of the server's (`answer_of`): an object with
    no `method` in any spelling is no request to any reader, whatever else it holds, and is
    returned as read (the last of two keys counting), to pass untouched.
    """
    what = "the JSON-RPC body"
    doc = read_strict(body, what, fold=True)
    problem = doc if isinstance(doc, NotStrict) else _misspelled_in(doc, what)
    if problem is None:
        return doc
    answer = answer_of(body)
    return answer if answer is not None else Refused(problem.why, "bad_json")


def _misspelled_in(doc: Any, what: str) -> NotStrict | None:
    """A key of the envelope or of params spelled in another case, in the message or a batch's item."""
    for i, message in enumerate(doc if isinstance(doc, list) else [doc]):
        at = str(i) if isinstance(doc, list) else ""  # a batch's item, or the message
        problem = misspelled(message, ENVELOPE, what, at or "the top level")
        if problem is None and isinstance(message, dict):
            problem = misspelled(message.get("params"), PARAMS, what, f"{at}.params" if at else "params")
        if problem is not None:
            return problem
    return None


def answer_of(body: bytes) -> dict[str, Any] | None:
    """
    A body that is a JSON-RPC response (the client's answer to the server's elicitation, sampling
    or roots request): a UTF-8 JSON object none of whose keys is `method` in any case or Unicode
    form, as read by a lenient parser (keys twice, NaN, lone surrogates). No reader takes it for a
    request, so no reader runs a tool for it: what its `result` holds is the client's business,
    and it passes untouched, even where a request would be refused. None: it is not one.
    """
    try:
        text = body.decode("utf-8")  # not UTF-8: decoders disagree on what is in it (read_strict refuses it)
    except UnicodeDecodeError:
        return None
    top: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        top[:] = [k for k, _ in items]  # the top-level object is the last one built
        return dict(items)

    try:
        doc = json.loads(text, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or any(_folded(k) == "method" for k in top):
        return None
    return doc


def _folded(key: str) -> str:
    return unicodedata.normalize("NFC", key.casefold()) if not key.isascii() else key.casefold()


def unread_call(body: bytes, tool: str, headers: Mapping[str, str]) -> ToolCall:
    """A refused request's call, as far as it can be read: its id, for the JSON-RPC error that answers it."""
    doc = parse_json(body)
    if doc is NOT_JSON:  # not UTF-8: its id as a server that replaces the bad bytes reads it
        doc = parse_json(body.decode("utf-8", "replace"))
    call_id = doc.get("id") if isinstance(doc, dict) else None
    if isinstance(call_id, bool) or not isinstance(call_id, (str, int, float)):
        call_id = None
    return ToolCall(call_id, tool, {}, "mcp-method" in headers)
