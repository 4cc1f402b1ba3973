"""
`receipts rules explain`: what the proxy would do with a request, without sending it.

    report = explain(rules, "POST", "https://api.github.com/repos/o/r/issues", body, headers, key)
    print(render(report))

The report names the operation that matches (or why none does), the fields that enter
the fingerprint with their values (credentials never: they are shown as REDACTED), the
fingerprint itself, how an answer would be classified and what a duplicate would get. It
warns when the fields the fingerprint names cannot be read from the body given (`warnings`:
the body is not JSON, is declared as another type, lacks some or all of them), so that the
intent would be the hash of the whole body, or hold nulls, rather than what the rule means.
It matches and fingerprints exactly as the proxy does: `RuleSet.match` and `fingerprint` on
the URL as given, whose canonical form (canonical.py) the report shows when it differs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from proxy_addon import gql
from proxy_addon.bodies import codings, decode_body
from proxy_addon.canonical import canonical_host, canonical_path, method_overrides
from proxy_addon.errors import BadEncoding, BodyTooLarge
from proxy_addon.fingerprint import NOTES, Intent, RequestView, fingerprint, intent_notes
from proxy_addon.jsonpath import NOT_JSON, parse_json
from proxy_addon.mcp.explain import describe_tool_call
from proxy_addon.redaction import ALWAYS_SECRET_HEADERS, REDACTED, SECRET_NAME, redact_url
from proxy_addon.rules import ANY_TOOL, Check, ClassifyRule, Operation, ReconcileSpec, RuleSet

SHOWN = 120  # characters of a value shown
BODY_LIMIT = 256 * 1024 * 1024  # bytes a --body may decode to (the proxy's own bound is receipts_body_cap)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"


def _no_match(rules: RuleSet, host: str, port: int, method: str, path: str, body: bytes) -> list[str]:
    """Why no operation matched: which rules files know the host, and what they match instead."""
    files = rules.files_for(host, port)
    if not files:
        hosts = sorted({h for f in rules.files for h in f.hosts})
        return [
            f"no rules file names the host {canonical_host(host)} (the rules name: {', '.join(hosts) or 'none'})",
            "the proxy passes this request through untouched",
        ]
    lines = []
    bare = canonical_path(path).split("?")[0]
    for f in files:
        lines.append(f"no operation of {f.api} ({f.source}) matches {method} {bare}:")
        mutation = gql.mutation_fields(body) if any(op.graphql for op in f.operations) else None
        for op in f.operations:
            why = ""
            if op.method != method:
                why = f"method is {op.method}"
            elif op.path.match(bare) is None:
                why = "path differs"
                if re.fullmatch(op.path.regex.pattern, bare, re.IGNORECASE | re.ASCII):
                    why += " in letter case only (paths are case-sensitive unless match.case_insensitive: true)"
            elif op.graphql:
                why = (
                    "the body is not a GraphQL mutation"
                    if mutation is None
                    else f"the mutation's root fields are {', '.join(mutation) or 'none'}, not {op.graphql}"
                )
            elif op.mcp_tool and op.mcp_tool != ANY_TOOL:
                named = ", ".join(f"{k}={v}" for k, v in op.mcp_arguments)
                why = f"the body is not a tools/call of {op.mcp_tool}" + (f" with {named}" if named else "")
            lines.append(
                f"  {op.name}: {op.method} {op.path.template}"
                + (f" (mutation {op.graphql})" if op.graphql else "")
                + (f" (MCP tool {op.mcp_tool})" if op.mcp_tool else "")
                + (f": {why}" if why else "")
            )
    lines.append("the proxy passes this request through untouched")
    return lines


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


def _duplicates(op: Operation) -> list[str]:
    after = {
        "replay": "answered with the recorded response (within receipts_replay_window), never sent again",
        "block": "blocked with 409 duplicate_succeeded, never sent again",
        "allow": "sent again as a new attempt",
    }[op.after_success]
    lines = [
        "while the first attempt is unresolved (submitted, outcome_unknown, reconciling, manual_review): "
        "blocked with 409 duplicate_unresolved",
        f"after it succeeded: {after}",
        "after it was rejected or provably not sent: sent again as a retry",
    ]
    spec = op.reconcile
    when = "after an unknown outcome"
    if op.idempotency_header:
        within = (
            f" while the API remembers the key ({op.idempotency_ttl}s from its first use)" if op.idempotency_ttl else ""
        )
        lines.append(
            f"{when}: sent again with the same {op.idempotency_header}{within}, "
            "which the API deduplicates (no read needed)"
        )
        if not op.idempotency_ttl:
            return lines
        when = "once the API has forgotten the key"
    if spec is None:
        lines.append(f"{when}: blocked until someone resolves it (no reconcile read in the rule)")
    else:
        absence = (
            "never proves absence: manual_review when not found"
            if not spec.absence_provable
            else (
                "proves absence"
                + (f" {spec.settle}s after the outcome became unknown" if spec.settle else " at once")
                + ("; then safe_to_retry" if spec.retry_when_absent else "; then manual_review (no retry_when_absent)")
            )
        )
        read = f"{spec.method} {spec.url}"
        if spec.tool is not None:
            read = (
                f"a call of the MCP tool {spec.tool} in a session of its own ("
                + (
                    "read-only by the rule's word"
                    if spec.tool_read_only
                    else "only if tools/list says readOnlyHint: true"
                )
                + ")"
            )
        lines.append(f"{when}: the duplicate triggers a read, {read}: found → succeeded; {absence}")
        pages = _pages(spec)
        if pages:
            lines.append(f"the read's list: {pages}")
    return lines


def _pages(spec: ReconcileSpec) -> str | None:
    """How the read's list continues (`reconcile.pages`), or None for a read that is no list."""
    pages = spec.pages
    if pages is None:
        if spec.complete_in_one_page:
            return "one page; the rule vouches that it holds every match (complete_in_one_page)"
        if not (spec.find or spec.items or spec.bounds):
            return None
        return (
            "one page (no pages declared); an answer that says there is more (has_more, a next cursor, "
            'a Link rel="next") proves nothing'
        )
    if pages.link:
        how = "follows the answer's Link rel=\"next\" (on the read's own origin)"
    else:
        where = f"the body field {pages.param}" if spec.body is not None else f"the query parameter {pages.param}"
        how = (
            f"while {pages.more} is true, the next page asks with {pages.from_} as {where}"
            if pages.more
            else f"while {pages.from_} has a value, the next page asks with it as {where}"
        )
    return (
        f"{how}, at most {pages.max} pages (pages.max); found on any page → succeeded, "
        '"not found" counts only when the walk reached the list\'s end (a walk cut at the max proves nothing)'
    )


def _decoded(body: bytes, encoding: str | None, limit: int) -> tuple[bytes, str | None]:
    """The body as the proxy fingerprints it (its Content-Encoding decoded), or b"" and why it is refused."""
    if not codings(encoding):
        return body, None
    try:
        return decode_body(body, encoding, limit=limit), None
    except (BadEncoding, BodyTooLarge) as e:
        return b"", str(e)


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
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL")
    port = u.port or {"http": 80, "https": 443}[u.scheme]
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    shown_headers = {
        k: REDACTED if k in ALWAYS_SECRET_HEADERS or SECRET_NAME.search(k) else v for k, v in headers.items()
    }
    view = RequestView(method, u.scheme, u.hostname, port, path, headers, body)
    where = view.target
    report: dict[str, Any] = {
        "request": f"{method} {redact_url(u.scheme, u.hostname, port, path)}",
        "headers": shown_headers,
        "sent": False,
    }
    if codings(encoding) and refused is None:
        report["body"] = (
            f"{raw_size} bytes as {encoding}, {len(body)} bytes decoded: the fingerprint reads the decoded body"
        )
    if where.changed:
        report["canonical"] = f"{method} {redact_url(where.scheme, where.host, where.port, where.path)}"
    m = rules.match(u.hostname, port, method, path, body=body, headers=headers.items())
    if m is None:
        report["match"] = None
        report["why"] = _no_match(rules, u.hostname, port, method, path, body)
        if named := sorted({n for _, n in method_overrides(headers.items())} - {method}):
            report["why"].insert(-1, f"nor does {' or '.join(named)}, which its method override headers name")
        return report
    op = m.operation
    refused = refused or m.refused  # its method override headers (RuleSet.match)
    if op.method != method:  # matched as the method an override header names
        report["canonical"] = f"{op.method} {redact_url(where.scheme, where.host, where.port, where.path)}"
    for name in op.credential_headers:
        if headers.get(name):
            shown_headers[name] = REDACTED
    # As stored: the values of the query parameters the fingerprint names, every other one REDACTED.
    report["request"] = f"{method} {redact_url(u.scheme, u.hostname, port, path, keep=op.fingerprint.query)}"
    if refused is not None:
        report["match"] = {"api": op.api, "operation": op.name, "source": f"{op.source}:{op.line}"}
        report["refused"] = refused
        return report
    _describe(report, op, fingerprint(m, view, key), headers, body)
    if m.mcp_call is not None:
        describe_tool_call(report, op, m.mcp_call.name, [_rule_text(r) for r in op.classify_rules])
    return report


# The body fallbacks (intent_body.FALLBACKS) that leave the named fields unread: the intent is the whole body's hash.
_UNREAD = {
    "not_json": "it is not JSON",
    "not_a_json_object": "it is JSON but not an object, so it has no fields",
    "bad_form": "it is declared as a form (application/x-www-form-urlencoded) but is neither a form nor a JSON object",
    "bad_multipart": "it is declared as multipart/form-data but is not well-formed",
    "no_named_field": "it has none of them",
    "empty": "it is empty",
}
_NAMES_SHOWN = 12  # a body's field names listed in a warning, at most


def _body_names(ctype: str, body: bytes) -> tuple[str, list[str]] | None:
    """What the body holds, as the proxy would read it: ("JSON object" | "form", its top-level names)."""
    doc = parse_json(body)
    if isinstance(doc, dict) and ctype != "application/x-www-form-urlencoded":
        return "JSON object", list(doc)
    try:
        form = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        form = []
    if form and (ctype == "application/x-www-form-urlencoded" or doc is NOT_JSON):
        return "form", list(dict.fromkeys(k for k, _ in form))
    if isinstance(doc, dict):
        return "JSON object", list(doc)
    return None


def _hint(fallback: str, held: tuple[str, list[str]] | None, ctype: str) -> str | None:
    """What to change so that the named fields are read: the Content-Type, or how names are read."""
    if held is None:
        return None
    if held[0] == "JSON object" and ctype not in ("application/json", ""):
        return "the body is a JSON object: send it with Content-Type: application/json"
    if held[0] == "form" and ctype != "application/x-www-form-urlencoded":
        return (
            "the body is form-encoded: send it with Content-Type: application/x-www-form-urlencoded "
            "(rules explain --form), or send JSON with Content-Type: application/json"
        )
    if fallback != "no_named_field":
        return None
    if held[0] == "form":
        return (
            "a form field is read by its whole name (fingerprint.body: [metadata[order_id]] reads "
            "metadata[order_id]=…); if the API takes JSON, send JSON with Content-Type: application/json"
        )
    return 'a name in fingerprint.body is a dotted path into the JSON: article.title reads {"article": {"title": …}}'


def _body_warnings(op: Operation, intent: Mapping[str, Any], headers: Mapping[str, str], body: bytes) -> list[str]:
    """
    Why the fingerprint's named body fields cannot be applied to this body, and what to do: the
    intent then falls back to the whole body's SHA-256 (`fallback`), or counts a missing field as
    null (`missing`). Names only, never values. Empty when the fields were read as the rule says.
    """
    fields = op.fingerprint.body
    if not fields:
        return []
    named = ", ".join(fields)
    ctype = headers.get("content-type", "").split(";")[0].strip().lower()
    warnings = []
    fallback = intent.get("fallback")
    if fallback in _UNREAD:
        why = _UNREAD[fallback]
        held = _body_names(ctype, body) if body else None
        if fallback == "no_named_field":
            if op.graphql:
                why = "the mutation's arguments have none of them"
            elif held is not None and held[1]:
                more = "…" if len(held[1]) > _NAMES_SHOWN else ""
                why += f" (read as a {held[0]}, its fields are: {', '.join(held[1][:_NAMES_SHOWN])}{more})"
        declared = f"Content-Type {ctype}" if ctype else "no Content-Type"
        instead = (
            "The intent is the SHA-256 of the empty body instead: every request of this operation without a body "
            "(the same path and credentials) is one intent"
            if fallback == "empty"
            else "The intent is the SHA-256 of the whole body instead: a repeat is recognised only when it is the "
            "same byte for byte (another key order, spacing or value of a field the rule leaves out makes another "
            "intent)"
        )
        warnings.append(
            f"the fingerprint's named fields ({named}) cannot be read from this body ({declared}): {why}. {instead}"
        )
        hint = None if op.graphql else _hint(fallback, held, ctype)  # GraphQL: paths into the mutation's arguments
        if hint:
            warnings.append(hint)
    if missing := intent.get("missing"):
        warnings.append(
            f"named fields not in this body: {', '.join(missing)}; each counts as null, so the same request with "
            "them is another intent"
        )
    return warnings


def _describe(report: dict[str, Any], op: Operation, intent: Intent, headers: Mapping[str, str], body: bytes) -> None:
    """The matched operation's part of the report: the fingerprint, classification, identity and duplicates."""
    report["match"] = {
        "api": op.api,
        "operation": op.name,
        "source": f"{op.source}:{op.line}",
        "description": op.description,
        "graphql": op.graphql,
    }
    warnings = _body_warnings(op, intent.intent, headers, body)
    warned = {"missing", *(["fallback"] if intent.intent.get("fallback") in _UNREAD else [])} if warnings else set()
    report["fingerprint"] = {
        "fields": dict(
            kv for part, value in intent.intent.items() if part not in NOTES for kv in _flatten(part, value)
        ),
        "principal": intent.principal,
        "value": intent.fingerprint,
        # how the body was read: hashed fields, json_sent_as_form, a method override (what warnings do not say)
        "notes": intent_notes({k: v for k, v in intent.intent.items() if k not in warned}),
        "warnings": warnings,  # the named fields cannot be applied to this body (_body_warnings)
    }
    report["classify"] = (
        [_rule_text(r) for r in op.classify_rules]
        + [f"HTTP {k} → {v}" for k, v in op.classify]
        + ["otherwise: 2xx/3xx → succeeded, 408 → outcome_unknown, other 4xx → rejected, 5xx → outcome_unknown"]
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
    report["duplicates"] = _duplicates(op)
    if op.approve:
        report["duplicates"].insert(
            0, "each write waits for an operator's approval (mitmweb, receipts approve) before it is sent"
        )


def render(report: dict[str, Any]) -> str:
    lines = [report["request"]]
    if "canonical" in report:
        lines.append(f"  matched as {report['canonical']} (its canonical form; it is forwarded as written)")
    lines += [f"  {k}: {v}" for k, v in report["headers"].items()]
    if "body" in report:
        lines.append(f"  body: {report['body']}")
    if report["match"] is None:
        lines += ["", *report["why"], "", "Nothing was sent."]
        return "\n".join(lines)
    m = report["match"]
    lines += ["", f"operation: {m['api']} {m['operation']}  ({m['source']})"]
    if "refused" in report:
        lines += ["", f"the proxy refuses this request and sends nothing: {report['refused']}", "", "Nothing was sent."]
        return "\n".join(lines)
    if m["description"]:
        lines.append(f"  {m['description']}")
    if m["graphql"]:
        lines.append(f"  recognised by the mutation's root field {m['graphql']}")
    if m.get("mcp"):
        lines.append(
            f"  the MCP tool call {m['mcp']['tool']} (its JSON-RPC id and session never enter the fingerprint)"
        )
        if m["mcp"]["derived"]:
            lines.append(f"  derived: {m['mcp']['why']}")
    fp = report["fingerprint"]
    lines += ["", "fingerprint fields (nothing else of the request enters it):"]
    lines += [f"  {k} = {_short(v)}" for k, v in fp["fields"].items()] or ["  (none: the body is ignored)"]
    lines += [f"  note: {n}" for n in fp.get("notes", ())]
    lines += [f"  WARNING: {w}" for w in fp.get("warnings", ())]
    principal = fp["principal"]
    shown = "anonymous (no credential)" if principal == "anonymous" else f"{principal} (a keyed hash of the credential)"
    lines.append(f"  principal = {shown}")
    lines += [f"fingerprint: {fp['value']}"]
    if "key_note" in report:
        lines.append(f"  ({report['key_note']})")
    if "existing" in report:
        e = report["existing"]
        lines.append(
            f"  the receipts database has {e['operation_id']} with this fingerprint: {e['state']} "
            f"(submitted {e['submitted_at']})"
        )
    lines += ["", "answers:"] + [f"  {c}" for c in report["classify"]]
    if "external_id" in report:
        lines.append(f"  the created object's id: {report['external_id']}")
    if "identity" in report:
        lines += ["", f"identity: {report['identity']}"]
    lines += ["", "a duplicate:"] + [f"  {d}" for d in report["duplicates"]]
    lines += ["", "Nothing was sent."]
    return "\n".join(lines)
