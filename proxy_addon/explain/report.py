"""
The report `receipts rules explain` prints (render.py prints it as text): the operation that
matches (or why none does: no_match.py), the fields that enter the fingerprint with their
values (credentials never: they are shown as REDACTED), the fingerprint itself, how an answer
would be classified, the identity the proxy adds, what a duplicate would get (duplicates.py) and
which decision of the rules' `decisions:` it gets, and why (decision_trace.py).
Warnings say when the named fields cannot be read from the body given (body_warnings.py).
It matches and fingerprints exactly as the proxy does: `RuleSet.match` and `fingerprint` on
the URL as given, whose canonical form (wire/canonical.py) the report shows when it differs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import SplitResult, urlsplit

from proxy_addon.errors import BadEncoding, BadJson, BodyTooLarge, UnpairedSurrogate
from proxy_addon.explain.body_warnings import UNREAD, body_warnings
from proxy_addon.explain.decision_trace import describe_decisions
from proxy_addon.explain.duplicates import duplicates
from proxy_addon.explain.no_match import why_no_match
from proxy_addon.explain.tool_calls import describe_tool_call
from proxy_addon.intent.caller import secret_params
from proxy_addon.intent.fingerprint import NOTES, Intent, RequestView, fingerprint, intent_notes, text_headers
from proxy_addon.rules import Check, ClassifyRule, Match, Operation, RuleSet
from proxy_addon.wire.bodies import codings, decode_body
from proxy_addon.wire.canonical import Target, method_overrides
from proxy_addon.wire.redaction import (
    ALWAYS_SECRET_HEADERS,
    REDACTED,
    SECRET_NAME,
    is_credential_name,
    redact_url,
    token_shaped,
    webhook_tokens,
)

BODY_LIMIT = 256 * 1024 * 1024  # bytes a --body may decode to (the proxy's own bound is receipts_body_cap)


def _check_text(check: Check) -> str:
    if check.kind == "equal":
        return json.dumps(check.value)
    if check.kind == "one_of":
        return "one of " + ", ".join(json.dumps(v) for v in check.value)
    if check.kind == "matches":
        return f"matches /{check.value.pattern}/"
    if check.kind == "present":
        return "present" if check.value else "absent"
    return f"contains {json.dumps(check.value)}"


def _rule_text(rule: ClassifyRule) -> str:
    tests = []
    if rule.statuses:
        tests.append("HTTP " + "/".join(rule.statuses))
    tests += [f"{path} {_check_text(c)}" for path, c in rule.body]
    tests += [f"header {name} {_check_text(c)}" for name, c in rule.headers]
    return " and ".join(tests) + f" → {rule.state}" + (f" ({rule.reason})" if rule.reason else "")


def _flatten(prefix: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict) and not value:
        return []
    if isinstance(value, dict) and prefix.count(".") < 1:
        return [kv for k, v in value.items() for kv in _flatten(f"{prefix}.{k}" if prefix else k, v)]
    return [(prefix, value)]


def _decoded(body: bytes, encoding: str | None, limit: int) -> tuple[bytes, str | None]:
    """The body as the proxy fingerprints it (its Content-Encoding decoded), or b"" and why it is refused."""
    if not codings(encoding):
        return body, None
    try:
        return decode_body(body, encoding, limit=limit), None
    except (BadEncoding, BodyTooLarge) as e:
        return b"", str(e)


def _undecodable(headers: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    """The first header the proxy reads as text whose value is not UTF-8 (a surrogate: bytes the shell
    could not decode), as the proxy refuses it (fields.undecodable)."""
    for name in names:
        value = headers.get(name)
        if value is not None and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return name
    return None


def explain(
    rules: RuleSet,
    method: str,
    url: str,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    key: bytes = b"",
    *,
    body_limit: int = BODY_LIMIT,
) -> dict[str, Any]:
    """What the proxy would do with this request, as a JSON-able report (`render` prints it).
    A body with a Content-Encoding is decoded first, as the proxy does (bodies.decode_body)."""
    headers = {k.lower(): v for k, v in (headers or {}).items()}
    encoding, raw_size = headers.get("content-encoding"), len(body)
    body, refused = _decoded(body, encoding, body_limit)
    method = method.upper()
    u, host, port, path = _target(url)
    shown_headers = _shown_headers(headers)
    view = RequestView(method, u.scheme, host, port, path, headers, body)
    where = view.target
    report: dict[str, Any] = {
        "request": f"{method} {redact_url(u.scheme, host, port, path)}",
        "headers": shown_headers,
        "sent": False,
    }
    if codings(encoding) and refused is None:
        report["body"] = (
            f"{raw_size} bytes as {encoding}, {len(body)} bytes decoded: the fingerprint reads the decoded body"
        )
    if where.changed:
        report["canonical"] = f"{method} {redact_url(where.scheme, where.host, where.port, where.path)}"
    m = rules.match(host, port, method, path, body=body, headers=headers.items())
    if m is None:
        return _no_match(report, rules, method, host, port, path, body, headers)
    op = m.operation
    refused = refused or m.refused  # its method override headers, or a target servers read differently
    if refused is None and (bad := _undecodable(headers, text_headers(m))) is not None:
        refused = f"its {bad} header is not UTF-8 text (400 undecodable_header)"
    _as_stored(report, m, view, where, shown_headers)
    try:
        intent = fingerprint(m, view, key) if refused is None else None
    except UnpairedSurrogate as e:  # as the proxy answers it: 400, nothing sent
        refused = f"{e} (400 unpaired_surrogate)"
    except BadJson as e:  # a key twice in the JSON body: the proxy answers 400 (wire/json_body.py)
        refused = str(e)
    if refused is not None or intent is None:
        report["match"] = {"api": op.api, "operation": op.name, "source": f"{op.source}:{op.line}"}
        report["refused"] = refused
        return report
    _describe(report, op, intent, headers, body)
    describe_decisions(report, op, intent)  # which decision it gets, and why (decision_trace.py)
    if m.mcp_call is not None:
        describe_tool_call(report, op, m.mcp_call.name, [_rule_text(r) for r in op.classify_rules])
    return report


def _target(url: str) -> tuple[SplitResult, str, int, str]:
    """The URL split, its host, its port and its request target (the fragment kept, as the proxy sees it)."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL")
    port = u.port or {"http": 80, "https": 443}[u.scheme]
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    if "#" in url:  # urlsplit leaves the fragment out; the proxy sees it in the request target (RuleSet.match)
        path += "#" + url.partition("#")[2]
    return u, u.hostname, port, path


def _shown_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers as the report shows them: every one that may carry a credential REDACTED."""
    return {
        k: REDACTED
        if k in ALWAYS_SECRET_HEADERS or SECRET_NAME.search(k) or is_credential_name(k) or token_shaped(v)
        else v
        for k, v in headers.items()
    }


def _no_match(
    report: dict[str, Any],
    rules: RuleSet,
    method: str,
    host: str,
    port: int,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
) -> dict[str, Any]:
    """The report of a request no rule matches: why not, rule by rule."""
    report["match"] = None
    report["why"] = why_no_match(rules, host, port, method, path, body)
    if named := sorted({n for _, n in method_overrides(headers.items())} - {method}):
        report["why"].insert(-1, f"nor does {' or '.join(named)}, which its method override headers name")
    return report


def _as_stored(
    report: dict[str, Any], m: Match, view: RequestView, where: Target, shown_headers: dict[str, str]
) -> None:
    """The matched request as the receipt would store it: its credentials (path, headers, query) REDACTED."""
    op, method = m.operation, view.method
    bare = where.path.partition("?")[0]
    hidden = (*secret_params(op, m.params, bare).values(), *webhook_tokens(bare))  # path credentials: REDACTED
    if where.changed:
        report["canonical"] = f"{method} {redact_url(where.scheme, where.host, where.port, where.path, secrets=hidden)}"
    if op.method != method:  # matched as the method an override header names
        canonical = redact_url(where.scheme, where.host, where.port, where.path, secrets=hidden)
        report["canonical"] = f"{op.method} {canonical}"
    for name in op.credential_headers:
        if view.headers.get(name):
            shown_headers[name] = REDACTED
    # As stored: the values of the query parameters the fingerprint names, every other one REDACTED.
    shown = redact_url(view.scheme, view.host, view.port, view.path, keep=op.fingerprint.query, secrets=hidden)
    report["request"] = f"{method} {shown}"


def _describe(report: dict[str, Any], op: Operation, intent: Intent, headers: Mapping[str, str], body: bytes) -> None:
    """The matched operation's part of the report: the fingerprint, classification, identity and duplicates."""
    report["match"] = {
        "api": op.api,
        "operation": op.name,
        "source": f"{op.source}:{op.line}",
        "description": op.description,
        "graphql": op.graphql,
    }
    warnings = body_warnings(op, intent.intent, headers, body)
    warned = {"missing", *(["fallback"] if intent.intent.get("fallback") in UNREAD else [])} if warnings else set()
    report["fingerprint"] = {
        "fields": dict(
            kv for part, value in intent.intent.items() if part not in NOTES for kv in _flatten(part, value)
        ),
        "principal": intent.principal,
        "credentials": list(intent.counted),  # where and which, never a value (intent/caller.py)
        "unidentified": list(intent.unidentified),
        "value": intent.fingerprint,
        # how the body was read: hashed fields, json_sent_as_form, a method override (what warnings do not say)
        "notes": intent_notes({k: v for k, v in intent.intent.items() if k not in warned}),
        "warnings": warnings,  # the named fields cannot be applied to this body (body_warnings.py)
    }
    report["classify"] = (
        [_rule_text(r) for r in op.classify_rules]
        + [f"HTTP {k} → {v}" for k, v in op.classify]
        + [
            "otherwise: 2xx/3xx → succeeded, 408 → outcome_unknown, 409 → already_exists (read to decide), "
            "other 4xx → rejected, 5xx → outcome_unknown"
        ]
    )
    if op.idempotency_header:
        report["identity"] = f"the proxy adds {op.idempotency_header}: <its key> (an agent's own key is kept)"
    elif op.idempotency_body:
        report["identity"] = (
            f"the proxy writes a {op.idempotency_format} id at {op.idempotency_body} (an agent's own value is kept)"
        )
    if op.external_id_header:
        report["external_id"] = f"header {op.external_id_header}"
    elif op.external_id:
        report["external_id"] = op.external_id if isinstance(op.external_id, str) else " + ".join(op.external_id)
    report["duplicates"] = duplicates(op)
    if intent.unidentified and op.after_success == "replay":
        report["duplicates"].insert(
            0,
            "no credential tells this caller apart: a success is never replayed to it, a duplicate gets 409 "
            "duplicate_succeeded instead (docs/rules.md, Credentials)",
        )
    if op.approve:
        report["duplicates"].insert(
            0, "each write waits for an operator's approval (mitmweb, receipts approve) before it is sent"
        )
