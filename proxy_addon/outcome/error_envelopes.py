"""
The proxy's own answers in the error envelope of the API they stand in for (a rules file's `errors:`).

An API's SDK reads only its own envelope: the OpenAI SDK turns `{"error": "duplicate_unresolved", ...}`
into a ConflictError whose text is "Error code: 409" and whose `body` is the bare string. Wrapped
here, the SDK's exception text carries the proxy's explanation and the receipt id, and the proxy's
whole answer (what http_answers.py built: error code, state, receipt id, sent, hints) stays under
one key, `receipt_proxy`: inside the error object where the API has one (openai, anthropic, stripe),
at the top level where it does not (github). For an API none of these fits, a rules file's own
template (rules/error_templates.py) is filled in with the same fields, and the whole answer goes
under the template's key. Nothing enters an envelope that the plain answer did not hold: the same
fields, the same redaction. A replay (the upstream's own recorded answer) is never wrapped.
"""

from __future__ import annotations

from typing import Any

from proxy_addon.outcome.http_answers import Answer, json_answer
from proxy_addon.rules.error_templates import is_template, parsed, pieces

KEY = "receipt_proxy"  # where the proxy's own answer sits in an envelope (docs/rules.md, Error envelopes)


def in_envelope(answer: Answer, errors: str) -> Answer:
    """`answer` in the envelope `errors` names (model.ERROR_ENVELOPES) or in a template's (its canonical
    text, rules/error_templates.py); plain, or a replay, as it is."""
    doc = answer.doc
    if errors == "plain" or doc is None or not isinstance(doc.get("error"), str):
        return answer
    code = str(doc["error"])
    text = message(doc)
    if is_template(errors):
        body = templated(answer.status, code, text, doc, errors)
    else:
        body = _ENVELOPES[errors](answer.status, code, text, doc)
    headers = {k: v for k, v in answer.headers if k.lower() != "content-length"}
    if errors in NO_RETRY and _retry_cannot_help(answer):
        headers[NO_RETRY[errors]] = "false"
    return json_answer(answer.status, body, headers)


# The header an SDK obeys before retrying on its own (openai and anthropic read x-should-retry, stripe
# Stripe-Should-Retry). Their default retries of a 409, 429 or 5xx would turn the proxy's answer into a
# blocked duplicate the agent sees in its place (a 502 outcome_unknown retried twice ends as 409).
NO_RETRY = {"openai": "x-should-retry", "anthropic": "x-should-retry", "stripe": "Stripe-Should-Retry"}


def _retry_cannot_help(answer: Answer) -> bool:
    """Sent again at once, the request gets the same answer or a blocked one: all but a 503 and a Retry-After."""
    return answer.status != 503 and not any(k.lower() == "retry-after" for k, _ in answer.headers)


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
    # `details.error_code`: the SDK's `e.error_code` (its counterpart of openai's `e.code`)
    return {"type": "error", "error": {"type": kind, "message": text, "details": {"error_code": code}, KEY: doc}}


def _stripe(status: int, code: str, text: str, doc: dict) -> dict:
    if code == "idempotency_key_reused":
        kind = "idempotency_error"
    else:
        kind = "api_error" if status >= 500 else "invalid_request_error"
    return {"error": {"type": kind, "code": code, "message": text, KEY: doc}}


def _github(status: int, code: str, text: str, doc: dict) -> dict:
    # GitHub's clients show `message`; `documentation_url` names where the proxy's answers are described.
    return {"message": text, "documentation_url": "docs/agents.md", "status": str(status), KEY: doc}


def templated(status: int, code: str, text: str, doc: dict, errors: str) -> dict:
    """A rules file's own template filled in (rules/error_templates.py), the plain answer under its key."""
    template, key = parsed(errors)
    values = {
        "code": code,
        "message": text,
        "status": status,
        "operation_id": doc.get("operation_id"),
        "state": doc.get("state"),
    }
    body = _filled(template, values)
    here = body
    for step in key[:-1]:  # the loader saw to it that each step is a mapping or absent, and the last absent
        here = here.setdefault(step, {})
    here[key[-1]] = doc
    return body


def _filled(value: Any, values: dict[str, Any]) -> Any:
    """A template's value with its placeholders filled in: a new value, the template left as it is."""
    if isinstance(value, dict):
        return {k: _filled(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v, values) for v in value]
    if not isinstance(value, str):
        return value
    parts = pieces(value)
    if len(parts) == 1 and parts[0][1]:  # exactly one placeholder: its value, of its own type
        return values[parts[0][0]]
    return "".join(("" if values[p] is None else str(values[p])) if is_name else p for p, is_name in parts)


_ENVELOPES = {"openai": _openai, "anthropic": _anthropic, "stripe": _stripe, "github": _github}
