"""
The rules model: the frozen values a rules file loads into, and how a request finds its operation.

    rules = RuleSet.of([rule_file, ...])
    m = rules.match("dev.to", 443, "POST", "/api/articles")   # Match(operation, params) or None

`match` takes the host and path as sent and matches their canonical form (wire/canonical.py):
`//api/./articles`, `/api/%61rticles` and `DEV.TO.` are `/api/articles` on `dev.to`. Paths
match case-sensitively unless the operation says `match.case_insensitive: true`. Given the
request's headers, it matches the method a method override header names (`GET` with
`X-HTTP-Method-Override: POST` is a POST), and refuses what it cannot take (`Match.refused`).

Nothing here reads YAML (see loader.py); graphql-core loads only when a GraphQL rule meets a body.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Literal

from proxy_addon.states import State
from proxy_addon.wire.canonical import canonical_encoding
from proxy_addon.wire.mcp_calls import ToolCall

AfterSuccess = Literal["replay", "block", "allow"]
AFTER_SUCCESS: tuple[str, ...] = ("replay", "block", "allow")
METHODS = ("POST", "PUT", "PATCH", "DELETE", "GET", "HEAD", "OPTIONS")
# `errors:` the error envelope the proxy's own answers take (outcome/error_envelopes.py): the API's own, so its
# SDK reads the explanation and the receipt id; plain (the default) is the proxy's own JSON. Or a template, for an
# API none of these fits (rules/error_templates.py).
ERROR_ENVELOPES = ("plain", "openai", "anthropic", "stripe", "github")
METHOD_OVERRIDE = ("honour", "refuse")  # `method_override:` honour (the default) or refuse X-HTTP-Method-Override
CLASSIFIABLE = (State.SUCCEEDED, State.REJECTED, State.OUTCOME_UNKNOWN)
ALREADY_EXISTS = "already_exists"  # a classify verdict: the answer says the effect may already exist; read to decide


# The keys each mapping of a rules file may have, in the order errors list them.
# proxy_addon/rules.schema.json describes the same keys (a test keeps them in step).
KEYS: dict[str, tuple[str, ...]] = {
    "file": (
        "api",
        "hosts",
        "credentials",
        "post_reads",
        "method_override",
        "errors",
        "mcp",
        "decisions",
        "operations",
    ),
    "mcp_endpoint": ("path", "tools", "annotations", "read_only_tools"),
    "credentials": ("header", "query", "body", "path", "env", "scheme"),
    "operation_credentials": ("header", "query", "body", "path"),
    "operation": (
        "description",
        "match",
        "credentials",
        "fingerprint",
        "external_id",
        "after_success",
        "classify",
        "reconcile",
        "idempotency_key",
        "approve",
        "record",
        "decisions",
        "budget",
    ),
    "match": ("method", "path", "graphql", "mcp", "case_insensitive", "method_override"),
    "mcp_match": ("tool", "arguments"),
    "fingerprint": ("path", "body", "query", "headers"),
    "external_id": ("header",),
    "classify_rule": ("status", "body", "headers", "state", "reason"),
    "absent_when": ("status", "body", "headers"),
    "check": ("present", "contains", "matches"),
    "reconcile": (
        "read",
        "find",
        "items",
        "absent_when",
        "absence_provable",
        "settle",
        "retry_when_absent",
        "external_id",
        "pages",
        "complete_in_one_page",
    ),
    "read": ("method", "url", "headers", "body", "tool", "arguments", "read_only"),
    "pages": ("next", "max"),
    "pages_next": ("more", "from", "param"),
    "idempotency_key": ("header", "body", "format", "ttl"),
    "decision": ("allow", "approve", "deny", "reason"),
    "errors": ("template", "key"),  # `errors:` as a template (rules/error_templates.py)
    "budget": ("per", "window", "count", "sum", "max"),
}

CREDENTIAL_PLACES = ("credential_query", "credential_body", "credential_path")  # in fingerprint_rule()

TEMPLATE_VAR = re.compile(r"\{([^{}]*)\}")  # a {name} in a path or reconcile template
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class PathTemplate:
    template: str
    params: tuple[str, ...]
    regex: re.Pattern[str]
    case_insensitive: bool = False  # letters of the template's literal parts match either case (ASCII only)
    # `match.path: [a, b]`: the templates, the first that fits matching; `params` are those in every one of them
    alternatives: tuple[PathTemplate, ...] = ()

    def match(self, path: str) -> dict[str, str] | None:
        """The parameters of a canonical path (no query string) that fits, or None."""
        if self.alternatives:
            return next((found for t in self.alternatives if (found := t.match(path)) is not None), None)
        m = self.regex.fullmatch(path)
        return m.groupdict() if m else None

    def fits_in_another_case(self, path: str) -> bool:
        """Whether the path would fit with its letters in another case (what `receipts rules explain` says)."""
        return any(
            re.fullmatch(t.regex.pattern, path, re.IGNORECASE | re.ASCII) for t in (self.alternatives or (self,))
        )


@dataclass(frozen=True)
class FingerprintSpec:
    path: tuple[str, ...]
    body: tuple[str, ...] | None  # None: the whole body; (): the body is ignored
    query: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Check:
    """One test of a classify rule on a field or header: equal, one_of, present, contains or matches."""

    kind: str
    value: Any = None

    def fits(self, found: list[Any]) -> bool:
        """Whether any of the values found at a path (None: absent) passes the test."""
        present = [v for v in found if v is not None]
        if self.kind == "present":
            return bool(present) == self.value
        if self.kind == "equal":
            return any(same_value(v, self.value) for v in found)
        if self.kind == "one_of":
            return any(same_value(v, x) for v in found for x in self.value)
        if self.kind == "contains":
            return any(isinstance(v, str) and self.value in v for v in present)
        return any(isinstance(v, str) and self.value.search(v) for v in present)  # matches


def same_value(a: Any, b: Any) -> bool:
    """Equality with JSON's types: false is not 0, 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


@dataclass(frozen=True)
class ClassifyRule:
    """`classify:` list entry: when the status, body fields and headers fit, the answer is `state`."""

    state: str  # a State, or ALREADY_EXISTS
    statuses: tuple[str, ...] = ()  # "409", "4xx"; () → any
    body: tuple[tuple[str, Check], ...] = ()
    headers: tuple[tuple[str, Check], ...] = ()
    reason: str | None = None
    line: int = 0


MCP_TOOLS = ("declared", "from_server")  # `mcp.tools:` which tool calls of the endpoint are writes
MCP_ANNOTATIONS = ("untrusted", "trusted")  # `mcp.annotations:` whether the server's readOnlyHint makes a read
FROM_SERVER = "from_server"  # the name of the operation `mcp: {tools: from_server}` adds; it matches any tool (`*`)
ANY_TOOL = "*"

MAX_PAGES = 5  # `pages.max` when the rule says none
PAGES_LIMIT = 100  # the largest `pages.max` a rule may ask for


@dataclass(frozen=True)
class PagesSpec:
    """How a reconcile read's list continues (`reconcile.pages`); at most `max` pages are read."""

    link: bool = False  # the next page is the answer's `Link: <url>; rel="next"` (GitHub)
    more: str | None = None  # dotted field of the answer: true while more pages follow (has_more)
    from_: str | None = None  # dotted field whose value names the next page: "data.-1.id", next_cursor
    param: str | None = None  # GET: the query parameter it goes in; POST: a dotted path in the JSON body
    max: int = MAX_PAGES


@dataclass(frozen=True)
class ReconcileSpec:
    """How to look for an operation's effect with a read (never another write)."""

    method: str  # GET or HEAD; POST only to a path the file lists in post_reads
    url: str  # a template: absolute, or a path on the receipt's own origin
    find: tuple[tuple[str, str], ...] = ()  # (dotted field of an item, value template); () → the status decides
    items: str | None = None  # dotted path to the list in the JSON answer; None → the answer itself
    absence_provable: bool = False  # "not found" in this read proves the effect does not exist
    retry_when_absent: bool = False  # once absence is proven, the operation may be sent again
    external_id: str | tuple[str, ...] | None = None  # field(s) of the found item naming it
    body: Any = None  # POST reads: a JSON document whose strings are templates
    settle: int = 0  # seconds after the outcome became unknown before "not found" proves absence
    absent_when: ClassifyRule | None = None  # an answer that says "no such object" (a GraphQL error, a 404)
    headers: tuple[tuple[str, str], ...] = ()  # (name, value template) sent with the read, never credentials
    bounds: tuple[tuple[str, str, str], ...] = ()  # (field, "gte"|"lte", template): `find` by a range, like created_at
    pages: PagesSpec | None = None  # how the list continues; None: one page is read
    complete_in_one_page: bool = False  # the rule says one page holds every match (with a reason comment)
    tool: str | None = (
        None  # an MCP read: this tool of the receipt's own endpoint, `body` its arguments (reconcile/tool_reads.py)
    )
    tool_read_only: bool = False  # the rule vouches the tool is read-only; else the server's annotations must say so


DECISIONS = ("allow", "approve", "deny")  # what a `decisions:` entry may say
# The tests of a decision's condition: `{field: {op: value}}` (a bare value: ==)
CONDITION_OPS = ("==", "!=", "<", "<=", ">", ">=", "in", "not_in", "ends_with", "not_ends_with", "matches")
PRINCIPAL = "principal"  # a condition on the caller: the principal (a keyed hash, as receipts record it)


@dataclass(frozen=True)
class Condition:
    """One test on one named field of the intent (or the principal): `amount >= 100000`."""

    field: str
    op: str  # one of CONDITION_OPS
    value: Any  # a list for in / not_in, a compiled pattern for matches
    line: int = 0  # where the rules file names the field


@dataclass(frozen=True)
class DecisionRule:
    """A `decisions:` entry: when every condition holds, the write is allowed, held for approval or denied."""

    decision: str  # one of DECISIONS
    conditions: tuple[Condition, ...]
    reason: str | None = None
    line: int = 0
    index: int = 0  # its place in the list, to name it: decisions[0]
    in_file: bool = False  # the file's `decisions:` (after each operation's own), not the operation's


BUDGET_PER = ("operation", "principal")  # `budget.per`: one budget for every caller of the operation, or one each


@dataclass(frozen=True)
class Budget:
    """
    A `budget:` entry: at most `limit` writes (`sum` None: counted) or at most `limit` of a named
    field's sum per fixed window of `window` seconds, aligned to the UTC epoch; one budget for the
    operation, or one per principal. Counted from receipts (store/budgets.py).
    """

    window: int  # seconds
    limit: float  # count: writes; sum: the field's total
    per: str = "operation"  # one of BUDGET_PER
    sum: str | None = None  # the named field summed; None: each write counts 1
    index: int = 0  # its place in the operation's list, to name it: budget[0]
    line: int = 0

    def describe(self) -> str:
        """`budget[0]: 20 writes per 1h per principal`, `budget[1]: amount at most 500000 per 1d`."""
        what = f"{_number(self.limit)} writes" if self.sum is None else f"{self.sum} at most {_number(self.limit)}"
        each = " per principal" if self.per == "principal" else ""
        return f"budget[{self.index}]: {what} per {window_text(self.window)}{each}"


def window_text(seconds: int) -> str:
    """A window's length as a rules file writes it: 3600 → `1h`, 90 → `90s`."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


@dataclass(frozen=True)
class Operation:
    api: str
    name: str
    method: str
    path: PathTemplate
    fingerprint: FingerprintSpec
    credential_headers: tuple[str, ...]
    external_id: str | tuple[str, ...] | None = None  # dotted field(s) of the JSON answer; several → joined with ':'
    after_success: AfterSuccess = "replay"
    classify: tuple[tuple[str, str], ...] = ()  # ("404", state) before ("4xx", state); state: a State or ALREADY_EXISTS
    source: str = ""
    reconcile: ReconcileSpec | None = None
    idempotency_header: str | None = None  # the API deduplicates by this header; the proxy adds it
    approve: bool = False  # an operator approves each request (mitmweb, receipts approve) before it is sent
    # `decisions:` its own, then its file's: the first whose conditions hold decides; none: allow
    decisions: tuple[DecisionRule, ...] = ()
    budgets: tuple[Budget, ...] = ()  # `budget:` each must have room for a new write, else it is refused (429)
    record: bool = True  # keep the answer (sealed) to replay to a duplicate; False: keep none, block duplicates
    credentials_env: str | None = None  # env var with the credential, for reads run from the CLI
    graphql: str | None = None  # match only GraphQL mutations with this root field
    mcp_tool: str | None = None  # match only MCP tool calls (JSON-RPC tools/call) of this tool (proxy_addon/mcp)
    mcp_arguments: tuple[tuple[str, Any], ...] = ()  # ...whose arguments have these values (issue_write method=create)
    classify_rules: tuple[ClassifyRule, ...] = ()  # `classify:` as a list; tried before `classify`
    external_id_header: str | None = None  # the created object's id is in this response header
    idempotency_body: str | None = None  # the proxy writes its key at this dotted path of the JSON body
    idempotency_format: str = "receipt"  # receipt: receipt-<id>; uuid4
    idempotency_ttl: int = 0  # seconds the API remembers a key (Stripe, Resend: 24h); 0: forever
    credentials_scheme: str | None = None  # CLI reads send "<scheme> $VAR"
    line: int = 0
    description: str | None = None
    # the file's `errors:`: the envelope of the proxy's own answers, a name in ERROR_ENVELOPES or a template's
    # canonical JSON text (rules/error_templates.py)
    errors: str = "plain"
    method_override: str = "honour"  # refuse: a request with a method override header gets 400 (METHOD_OVERRIDE)
    # `mcp.tools: from_server`'s operation: the tools the rules name as reads (`mcp.read_only_tools`), and
    # whether the server's annotations are trusted (`mcp.annotations: trusted`): its readOnlyHint makes a read
    mcp_read_tools: tuple[str, ...] = ()
    mcp_trusts_annotations: bool = False
    # Credentials outside the headers (`credentials: {query, body, path}`), hashed into the principal (intent/caller.py)
    credential_query: tuple[str, ...] = ()  # query parameter names
    credential_body: tuple[str, ...] = ()  # body fields: a form's field names, dotted paths into JSON
    credential_path: tuple[str, ...] = ()  # path parameters: REDACTED in targets, a keyed hash in the intent

    def fingerprint_rule(self) -> dict[str, Any]:
        """
        What the fingerprint reads of this rule, as JSON values: the fields it takes and the
        credentials that make the principal. A receipt keeps its digest (`rule_digest`), and the
        store this description, so that a retry is still recognised under the rule its receipt
        was made with after the rule is edited (intent/earlier_fingerprints.py). Credentials declared
        in the query, body or path are listed only when there are any: a rule without them has
        the description (and the digest) it had before they could be declared.
        """
        spec = self.fingerprint
        rule: dict[str, Any] = {
            "path": list(spec.path),
            "query": list(spec.query),
            "headers": list(spec.headers),
            "body": None if spec.body is None else list(spec.body),
            "credential_headers": list(self.credential_headers),
        }
        for name, names in (
            ("credential_query", self.credential_query),
            ("credential_body", self.credential_body),
            ("credential_path", self.credential_path),
        ):
            if names:
                rule[name] = list(names)
        return rule

    @cached_property
    def rule_digest(self) -> str:
        """The digest of `fingerprint_rule()`, recorded on each receipt (computed once per operation)."""
        return rule_digest(self.fingerprint_rule())

    def under_rule(self, rule: Mapping[str, Any]) -> Operation:
        """This operation as it was under an earlier `fingerprint_rule()` description (ValueError if unreadable)."""
        try:
            body = rule["body"]
            spec = FingerprintSpec(
                path=tuple(rule["path"]),
                body=None if body is None else tuple(body),
                query=tuple(rule["query"]),
                headers=tuple(rule["headers"]),
            )
            credentials = tuple(rule["credential_headers"])
            # absent from a description stored before they could be declared: none
            query, body_, path = (_names(rule.get(k, [])) for k in CREDENTIAL_PLACES)
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a fingerprint rule: {e}") from None
        return replace(
            self,
            fingerprint=spec,
            credential_headers=credentials,
            credential_query=query,
            credential_body=body_,
            credential_path=path,
        )


def _names(value: Any) -> tuple[str, ...]:
    """A list of names in a stored `fingerprint_rule()` description (TypeError if it is not one)."""
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise TypeError(f"{value!r} is not a list of names")
    return tuple(value)


def rule_digest(rule: Mapping[str, Any]) -> str:
    """A short digest of a `fingerprint_rule()` description: equal descriptions, equal digests."""
    text = json.dumps(rule, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Match:
    operation: Operation
    params: dict[str, str]
    pending: bool = False  # a GraphQL operation: the body decides (RuleSet.match with body=...)
    graphql_args: dict[str, Any] | None = None  # the root field's arguments, variables substituted
    refused: str | None = None  # why the proxy answers 400 and sends nothing (its method override headers)
    mcp_call: ToolCall | None = None  # an MCP operation: the tool call the body makes
    # the refusal's kind when not a method override's: ruleset.AMBIGUOUS_TARGET, or bad_json for a body
    # read two ways on an MCP or GraphQL endpoint (wire/json_body.py)
    refused_as: str | None = None
    fingerprint_host: str | None = None  # the loopback name the rule names, when the request used another


@dataclass(frozen=True)
class RuleFile:
    api: str
    hosts: tuple[str, ...]
    operations: tuple[Operation, ...]
    source: str
    post_reads: tuple[PathTemplate, ...] = ()


def parse_path_template(template: str, *, case_insensitive: bool = False) -> PathTemplate:
    """
    Compile `/api/articles/{id}` into a matcher of canonical paths. Raises ValueError with the
    reason. The template's percent-encodings are normalised as a request's are (`%7e` is `~`);
    a template with `//`, `.` or `..` segments is refused: no canonical path has them.
    """
    if not template.startswith("/"):
        raise ValueError(f"path template {template!r} must start with '/'")
    if "?" in template or "#" in template:
        raise ValueError(
            f"path template {template!r} contains a query or fragment; "
            "match the path only and list query parameters under fingerprint.query"
        )
    if ";" in template:
        raise ValueError(
            f"path template {template!r} has a ';', which Tomcat, Jetty and Spring read as the start of path "
            "parameters and other servers as part of the segment: requests with one are refused (docs/rules.md); "
            "write a ';' that is part of the path as %3B"
        )
    segments = template.rstrip("/").split("/")[1:]
    if any(canonical_encoding(seg) in ("", ".", "..") for seg in segments):
        raise ValueError(
            f"path template {template!r} has an empty, '.' or '..' segment, which no request path has once "
            "'//' is merged and dot segments are removed (RFC 3986); write the path without them"
        )
    params: list[str] = []
    pattern = ""
    pos = 0
    for m in TEMPLATE_VAR.finditer(template):
        literal = template[pos : m.start()]
        if "{" in literal or "}" in literal:
            raise ValueError(f"unbalanced '{{' or '}}' in path template {template!r}")
        literal = canonical_encoding(literal)
        name = m.group(1)
        if not IDENT.match(name):
            raise ValueError(
                f"parameter {{{name}}} in path template {template!r} is not a valid name (letters, digits, _)"
            )
        if name in params:
            raise ValueError(f"parameter {{{name}}} appears twice in path template {template!r}")
        params.append(name)
        pattern += re.escape(literal) + f"(?P<{name}>[^/]+)"
        pos = m.end()
    rest = template[pos:]
    if "{" in rest or "}" in rest:
        raise ValueError(f"unbalanced '{{' or '}}' in path template {template!r}")
    rest = canonical_encoding(rest)
    pattern += re.escape(rest.rstrip("/")) + "/?"  # '/api/articles/' is the same route as '/api/articles'
    flags = re.IGNORECASE | re.ASCII if case_insensitive else 0
    return PathTemplate(template, tuple(params), re.compile(pattern, flags), case_insensitive)


def path_alternatives(parsed: Sequence[PathTemplate]) -> PathTemplate:
    """
    One template, or several parsed ones as one (`match.path: [/mcp/, /mcp/x/{toolset}]`: one
    operation at each of its paths). Of several, the first that fits matches, and the parameters
    are those that every one has: only those can be in the fingerprint, or in a reconcile template.
    """
    if len(parsed) == 1:
        return parsed[0]
    first = parsed[0]
    common = tuple(p for p in first.params if all(p in t.params for t in parsed[1:]))
    shown = " | ".join(t.template for t in parsed)
    return PathTemplate(shown, common, first.regex, first.case_insensitive, tuple(parsed))


def read_variables(spec: ReconcileSpec | None) -> frozenset[str]:
    """The template names (`intent.title`, `path.owner`) an operation's reconcile read uses: its values must be kept."""
    if spec is None:
        return frozenset()
    texts: list[str] = [spec.url, *(t for _, t in spec.find), *(t for _, _, t in spec.bounds)]
    texts += [t for _, t in spec.headers]
    texts += [spec.external_id] if isinstance(spec.external_id, str) else list(spec.external_id or ())
    stack: list[Any] = [spec.body]
    while stack:  # a POST read's or an MCP read's body: a JSON document whose strings are templates
        doc = stack.pop()
        if isinstance(doc, str):
            texts.append(doc)
        elif isinstance(doc, dict):
            stack += [*doc.keys(), *doc.values()]
        elif isinstance(doc, list):
            stack += doc
    return frozenset(name for text in texts for name in TEMPLATE_VAR.findall(text))


def template_variables(fp: FingerprintSpec) -> set[str]:
    """The names a reconcile template may use, given what the operation's fingerprint records."""
    names = {"external_id", "idempotency_key", "submitted_at", "submitted_at_unix"}
    names |= {f"path.{p}" for p in fp.path}
    names |= {f"query.{q}" for q in fp.query}
    names |= {f"header.{h}" for h in fp.headers}
    names |= {f"intent.{b}" for b in fp.body or ()}
    return names
