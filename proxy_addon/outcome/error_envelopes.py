"""
The proxy's own answers in the error envelope of the API they stand in for (a rules file's `errors:`).

An API's SDK reads only its own envelope: the OpenAI SDK turns `{"error": "duplicate_unresolved", ...}`
into a ConflictError whose text is "Error code: 409" and whose `body` is the bare string. Wrapped
here, the SDK's exception text carries the proxy's explanation and the receipt id, and the proxy's
whole answer (what http_answers.py built: error code, state, receipt id, sent, hints) stays under
one key, `receipt_proxy`: inside the error object where the API has one (openai, anthropic, stripe),
at the top level where it does not (github). Nothing enters an envelope that the plain answer did
not hold: the same fields, the same redaction. A replay (the upstream's own recorded answer) is
never wrapped.
"""

from __future__ import annotations

from proxy_addon.outcome.http_answers import Answer, json_answer

KEY = "receipt_proxy"  # where the proxy's own answer sits in an envelope (docs/rules.md, Error envelopes)


def in_envelope(answer: Answer, errors: str) -> Answer:
    """`answer` in the envelope `errors` names (model.ERROR_ENVELOPES); plain, or a replay, as it is."""
    doc = answer.doc
    if errors == "plain" or doc is None or not isinstance(doc.get("error"), str):
        return answer
    code = str(doc["error"])
    build = _ENVELOPES[errors]
    headers = {k: v for k, v in answer.headers if k.lower() != "content-length"}
    return json_answer(answer.status, build(answer.status, code, message(doc), doc), headers)


def message(doc: dict) -> str:
    """
    The human text an SDK shows: what happened and what to do (the answer's detail and hint), and
    the receipt that records it, or that nothing was sent and no receipt kept.
    """
    parts = [str(doc[k]) for k in ("detail", "reason", "hint") if doc.get(k)]
    said = "; ".join(parts) if parts else "the proxy answered in place of the API"
    if doc.get("operation_id"):
        where = f"receipt {doc['operation_id']}"
        if doc.get("state"):
            where += f", state {doc['state']}"
    elif doc.get("sent") is False:
        where = "not sent, no receipt"
    else:
        where = "no receipt"
    return f"receipt-proxy {doc['error']}: {said} ({where})"


def _openai(status: int, code: str, text: str, doc: dict) -> dict:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": text, "type": kind, "code": code, "param": None, KEY: doc}}


def _anthropic(status: int, code: str, text: str, doc: dict) -> dict:
    kind = {403: "permission_error", 413: "request_too_large", 429: "rate_limit_error"}.get(status)
    if kind is None:
        kind = "api_error" if status >= 500 else "invalid_request_error"
    return {"type": "error", "error": {"type": kind, "message": text, KEY: doc}}


def _stripe(status: int, code: str, text: str, doc: dict) -> dict:
    if code == "idempotency_key_reused":
        kind = "idempotency_error"
    else:
        kind = "api_error" if status >= 500 else "invalid_request_error"
    return {"error": {"type": kind, "code": code, "message": text, KEY: doc}}


def _github(status: int, code: str, text: str, doc: dict) -> dict:
    # GitHub's clients show `message`; `documentation_url` names where the proxy's answers are described.
    return {"message": text, "documentation_url": "docs/agents.md", "status": str(status), KEY: doc}


_ENVELOPES = {"openai": _openai, "anthropic": _anthropic, "stripe": _stripe, "github": _github}
