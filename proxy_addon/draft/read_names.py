"""
Which operations read by their names, for a draft: RPC-style APIs (Slack's `/chat.postMessage`,
where reads are POSTs too, and a method's HTTP verb says nothing), and a REST API's POST search.

    reads_as_read("conversations.list")    # True
    reads_as_read("chat.postMessage")      # False
    is_rpc_style(["/chat.postMessage", "/conversations.list", ...])   # True

A name is a read when its verb (the method's last dotted part, or an operationId's first word)
starts with a reading word (`list`, `get`, `info`, ...) or ends with a reading noun
(`teamInfo`, `accessLogs`). Anything else is taken for a write: a receipt on a read costs a
replayed answer, a write taken for a read goes out with no receipt at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

READ_FIRST = frozenset(
    {
        "list",
        "get",
        "info",
        "history",
        "search",
        "lookup",
        "find",
        "fetch",
        "read",
        "query",
        "count",
        "check",
        "test",
        "describe",
        "show",
        "exists",
        "status",
        "replies",
        "members",
        "identity",
        "retrieve",
        "preview",
    }
)
READ_LAST = frozenset(
    {"info", "list", "logs", "history", "count", "status", "members", "replies", "presence", "permalink"}
)
# Verbs that write: `users.setPresence` is no read for ending in `presence`.
WRITE_FIRST = frozenset(
    {
        "set",
        "add",
        "remove",
        "update",
        "create",
        "delete",
        "post",
        "send",
        "invite",
        "publish",
        "push",
        "revoke",
        "reset",
        "cancel",
        "schedule",
        "upload",
        "share",
        "mark",
        "end",
        "close",
        "open",
    }
)
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_RPC_SEGMENT = re.compile(r"^/[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)+$")


def words(name: str) -> list[str]:
    """`getPermalink` → [get, permalink]; `send-batch` → [send, batch]; `SearchRecipient` → [search, recipient]."""
    return [w.lower() for w in _WORD.findall(name)]


def reads_as_read(method: str) -> bool:
    """Whether an RPC method name (`conversations.list`) or an operationId reads as a read."""
    return reading_word(method) is not None


def reading_word(method: str) -> str | None:
    """
    The word that makes a name read as a read (for the draft's comment), or None: the verb's first
    word (`getPermalink`), its last unless its first writes (`teamInfo`, not `setPresence`), or a
    family named by a reading word when the verb is no writing one (`search.messages`).
    """
    parts = [p for p in re.split(r"[./]", method) if p]
    found = words(parts[-1]) if parts else []
    if not found or found[0] in WRITE_FIRST:
        return None
    if found[0] in READ_FIRST:
        return found[0]
    if found[-1] in READ_LAST:
        return found[-1]
    return next((w for p in parts[:-1] for w in words(p)[:1] if w in READ_FIRST), None)


def is_rpc_style(paths: Iterable[str]) -> bool:
    """At least three paths, and most of them one segment named like `family.method` (`/chat.postMessage`)."""
    paths = list(paths)
    rpc = sum(1 for p in paths if _RPC_SEGMENT.match(p))
    return rpc >= 3 and rpc * 2 > len(paths)


def family(method: str) -> str:
    """`chat.postMessage` → `chat`; `admin.users.invite` → `admin.users`."""
    return method.rsplit(".", 1)[0] if "." in method else method
