"""
A DraftFile written as a rules file: YAML the loader takes as it is, with its notes as comments
and what is left to decide as `# TODO:` comments (one per line they start; long ones go on with
`#   ` lines), which `receipts rules check` lists as warnings (rules/todo_comments.py).

Values are written in flow style (`{method: POST, path: /emails}`), each scalar plain when YAML
reads it back as the same string, else as a JSON string (double-quoted YAML).
"""

from __future__ import annotations

import json
import re
import textwrap
from typing import Any

from proxy_addon.draft.draft_model import DraftFile, DraftOperation

WIDTH = 116
_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*\Z")
_YAML_WORDS = frozenset({"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def scalar(value: Any) -> str:
    """One value in YAML: `true`, `5`, `/emails`, `"/emails/{id}"`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if value is None:
        return "null"
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text, ensure_ascii=False)


def flow(value: Any) -> str:
    """A value in YAML flow style: `{next: {more: has_more, from: data.-1.id, param: after}, max: 5}`."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{scalar(k)}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    return scalar(value)


def comment_text(text: str) -> str:
    """Text from a document made safe for one comment: no line breaks or control characters."""
    return _CONTROL.sub(" ", text).strip()


def comments(text: str, indent: str, *, todo: bool = False) -> list[str]:
    """A comment (`# TODO: ` first when `todo`), wrapped, each further line starting `#   `."""
    head = "# TODO: " if todo else "# "
    lines = textwrap.wrap(
        comment_text(text),
        width=max(40, WIDTH - len(indent)),
        initial_indent=head,
        subsequent_indent="#   ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [indent + line for line in lines or [head.rstrip()]]


def write_draft(draft: DraftFile) -> str:
    """The rules file's text."""
    out: list[str] = []
    for note in draft.notes:
        out += comments(note, "")
    for todo in draft.todos:
        out += comments(todo, "", todo=True)
    out += ["", f"api: {scalar(draft.api)}", f"hosts: {flow(draft.hosts)}"]
    for note in draft.credentials_notes:
        out += comments(note, "")
    if draft.credentials:
        out.append(f"credentials: {flow(draft.credentials)}")
    if draft.post_reads:
        out.append("post_reads:")
        for path, why in draft.post_reads:
            if why:
                out += comments(why, "  ")
            out.append(f"  - {scalar(path)}")
    out += ["", "operations:"]
    for i, op in enumerate(draft.operations):
        if i:
            out.append("")
        out += _operation(op)
    if draft.left_out:
        out.append("")
        for line in draft.left_out:
            out += comments(line, "")
    return "\n".join(out) + "\n"


def _operation(op: DraftOperation) -> list[str]:
    ind = "    "
    out = [f"  {scalar(op.name)}:"]
    for note in op.notes:
        out += comments(note, ind)
    for todo in op.todos:
        out += comments(todo, ind, todo=True)
    if op.description:
        out.append(f"{ind}description: {scalar(comment_text(op.description))}")
    out.append(f"{ind}match: {flow({'method': op.method, 'path': op.path})}")
    if op.fingerprint is not None:
        out.append(f"{ind}fingerprint:")
        out += [f"{ind}  {key}: {flow(names)}" for key, names in op.fingerprint.items()]
    if op.external_id is not None:
        out.append(f"{ind}external_id: {flow(op.external_id)}")
    if op.idempotency_key is not None:
        out.append(f"{ind}idempotency_key: {flow(op.idempotency_key)}")
    if not op.record:
        out.append(f"{ind}record: false")
    out += _block(ind, "classify", op.classify_notes, op.classify)
    out += _block(ind, "reconcile", op.reconcile_notes, op.reconcile)
    return out


def _block(ind: str, key: str, notes: list[str], value: Any) -> list[str]:
    """`classify:` (a list of rules) or `reconcile:` (a mapping), after its comments; only the comments if None."""
    out: list[str] = []
    for note in notes:
        out += comments(note[len("TODO: ") :], ind, todo=True) if note.startswith("TODO: ") else comments(note, ind)
    if value is None:
        return out
    out.append(f"{ind}{key}:")
    if isinstance(value, list):
        for rule in value:
            first = True
            for k, v in rule.items():
                out.append(f"{ind}  {'- ' if first else '  '}{scalar(k)}: {flow(v)}")
                first = False
    else:
        out += [f"{ind}  {scalar(k)}: {flow(v)}" for k, v in value.items()]
    return out
