"""
The small HTML pages an approval link shows a person (mitm/approval_server.py serves them).

    confirm(receipt, approve=True, expires_at=...)   # GET: what the write is, and a button that POSTs
    outcome(200, "Approved", "...")                  # after the POST, or why a link decides nothing

A GET only shows: mail and chat clients fetch links ahead of the reader, so only the form's POST
decides. Every value is HTML-escaped; the pages load nothing else (no script, no image).
"""

from __future__ import annotations

import json
from html import escape

from proxy_addon.store import Receipt

STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:42em;margin:2em auto;padding:0 1em;color:#222}"
    "pre{background:#f4f4f4;padding:.6em;white-space:pre-wrap;word-break:break-all}"
    "button{font-size:1.1em;padding:.4em 1.2em}textarea{width:100%}"
)
NOTE_MAX = 500  # characters of a denial's note kept from the form


def page(title: str, body: str) -> bytes:
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><meta name="robots" content="noindex">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body><h1>{escape(title)}</h1>{body}</body></html>"
    ).encode()


def _facts(receipt: Receipt, expires_at: str) -> str:
    intent = json.dumps(receipt.intent, sort_keys=True, indent=2, ensure_ascii=False)
    return (
        f"<p><b>{escape(receipt.api)} {escape(receipt.operation)}</b>: "
        f"<code>{escape(receipt.method)} {escape(receipt.target)}</code></p>"
        f"<p>Receipt <code>{escape(receipt.operation_id)}</code>, held since {escape(receipt.submitted_at)}; "
        f"denied unless decided before {escape(expires_at)}.</p><p>What it says (the intent):</p>"
        f"<pre>{escape(intent)}</pre>"
    )


def confirm(receipt: Receipt, *, approve: bool, expires_at: str) -> bytes:
    """The page a link's GET shows: the write, and a form whose POST decides."""
    if approve:
        form = '<form method="post"><button type="submit">Approve and send this write</button></form>'
        return page("Approve this write?", _facts(receipt, expires_at) + form)
    form = (
        '<form method="post"><p><label>Why (told to the agent in its 403):<br>'
        f'<textarea name="note" rows="3" maxlength="{NOTE_MAX}"></textarea></label></p>'
        '<button type="submit">Deny this write</button></form>'
    )
    return page("Deny this write?", _facts(receipt, expires_at) + form)


def outcome(title: str, text: str, receipt: Receipt | None = None) -> bytes:
    """A page that says what happened (or why nothing did), with the write when it is known."""
    facts = ""
    if receipt is not None:
        facts = (
            f"<p>Write: {escape(receipt.api)} {escape(receipt.operation)}, receipt "
            f"<code>{escape(receipt.operation_id)}</code>, now <b>{escape(str(receipt.state))}</b>.</p>"
        )
    return page(title, f"<p>{escape(text)}</p>{facts}")
