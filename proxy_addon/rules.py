"""
Rules: which requests are mutating operations, and what identifies their intent.

One YAML file per API. `load_rules(text, source)` is pure: it knows nothing of
mitmproxy and raises `RulesError` naming the file, the line and the field.
`load_rules_path(path)` reads a file or every `*.yaml`/`*.yml` in a folder.

    api: dev.to
    hosts: [dev.to]
    credentials: {header: api-key}
    operations:
      articles.create:
        match: {method: POST, path: /api/articles}
        fingerprint: {body: [article.title, article.body_markdown]}
        external_id: id
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from proxy_addon.errors import RulesError
from proxy_addon.paths import DEFAULT_RULES
from proxy_addon.redaction import ALWAYS_SECRET_HEADERS, SECRET_NAME
from proxy_addon.states import State

AfterSuccess = Literal["replay", "block", "allow"]
AFTER_SUCCESS: tuple[str, ...] = ("replay", "block", "allow")
METHODS = ("POST", "PUT", "PATCH", "DELETE", "GET", "HEAD", "OPTIONS")
CLASSIFIABLE = (State.SUCCEEDED, State.REJECTED, State.OUTCOME_UNKNOWN)


# The keys each mapping of a rules file may have, in the order errors list them.
# proxy_addon/rules.schema.json describes the same keys (a test keeps them in step).
KEYS: dict[str, tuple[str, ...]] = {
    "file": ("api", "hosts", "credentials", "post_reads", "operations"),
    "credentials": ("header", "env", "scheme"),
    "operation": ("description", "match", "fingerprint", "external_id", "after_success", "classify",
                  "reconcile", "idempotency_key", "approve"),
    "match": ("method", "path", "graphql"),
    "fingerprint": ("path", "body", "query", "headers"),
    "external_id": ("header",),
    "classify_rule": ("status", "body", "headers", "state", "reason"),
    "absent_when": ("status", "body", "headers"),
    "check": ("present", "contains", "matches"),
    "reconcile": ("read", "find", "items", "absent_when", "absence_provable", "settle", "retry_when_absent",
                  "external_id"),
    "read": ("method", "url", "headers", "body"),
    "idempotency_key": ("header", "body", "format", "ttl"),
}

_OPERATION_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_HOST = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*(:[0-9]{1,5})?\Z")
_PARAM = re.compile(r"\{([^{}]*)\}")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_DOTTED = re.compile(r"^[^.\s]+(\.[^.\s]+)*\Z")
_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_STATUS_KEY = re.compile(r"^([1-5])([0-9][0-9]|xx)\Z")


@dataclass(frozen=True)
class PathTemplate:
    template: str
    params: tuple[str, ...]
    regex: re.Pattern[str]

    def match(self, path: str) -> dict[str, str] | None:
        m = self.regex.fullmatch(path)
        return m.groupdict() if m else None


@dataclass(frozen=True)
class FingerprintSpec:
    path: tuple[str, ...]
    body: tuple[str, ...] | None  # None: the whole body; (): the body is ignored
    query: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()


ALREADY_EXISTS = "already_exists"  # a classify verdict: the answer says the effect may already exist; read to decide


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
            return any(_same(v, self.value) for v in found)
        if self.kind == "one_of":
            return any(_same(v, x) for v in found for x in self.value)
        if self.kind == "contains":
            return any(isinstance(v, str) and self.value in v for v in present)
        return any(isinstance(v, str) and self.value.search(v) for v in present)  # matches


def _same(a: Any, b: Any) -> bool:
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
    approve: bool = False  # an operator approves each request in mitmweb before it is sent
    credentials_env: str | None = None  # env var with the credential, for reads run from the CLI
    graphql: str | None = None  # match only GraphQL mutations with this root field
    classify_rules: tuple[ClassifyRule, ...] = ()  # `classify:` as a list; tried before `classify`
    external_id_header: str | None = None  # the created object's id is in this response header
    idempotency_body: str | None = None  # the proxy writes its key at this dotted path of the JSON body
    idempotency_format: str = "receipt"  # receipt: receipt-<id>; uuid4
    idempotency_ttl: int = 0  # seconds the API remembers a key (Stripe, Resend: 24h); 0: forever
    credentials_scheme: str | None = None  # CLI reads send "<scheme> $VAR"
    line: int = 0
    description: str | None = None


@dataclass(frozen=True)
class Match:
    operation: Operation
    params: dict[str, str]
    pending: bool = False  # a GraphQL operation: the body decides (RuleSet.match with body=...)
    graphql_args: dict[str, Any] | None = None  # the root field's arguments, variables substituted


@dataclass(frozen=True)
class RuleFile:
    api: str
    hosts: tuple[str, ...]
    operations: tuple[Operation, ...]
    source: str
    post_reads: tuple[PathTemplate, ...] = ()


@dataclass(frozen=True)
class RuleSet:
    files: tuple[RuleFile, ...] = ()
    _exact: Mapping[str, tuple[tuple[RuleFile, Operation], ...]] = field(default_factory=dict, repr=False)
    _wildcard: tuple[tuple[str, RuleFile, Operation], ...] = field(default=(), repr=False)

    @classmethod
    def of(cls, files: Iterable[RuleFile]) -> RuleSet:
        files = tuple(files)
        exact: dict[str, list] = {}
        wildcard = []
        for f in files:
            for host in f.hosts:
                for op in f.operations:
                    if host.startswith("*."):
                        wildcard.append((host[1:], f, op))
                    else:
                        exact.setdefault(host, []).append((f, op))
        return cls(files, {h: tuple(v) for h, v in exact.items()}, tuple(wildcard))

    @property
    def operations(self) -> tuple[Operation, ...]:
        return tuple(op for f in self.files for op in f.operations)

    def _candidates(self, host: str, port: int) -> tuple[tuple[RuleFile, Operation], ...]:
        """The operations of the files that name this host (exactly, with its port, or by a '*.' pattern)."""
        host = host.lower().rstrip(".")
        candidates = self._exact.get(f"{host}:{port}", ()) + self._exact.get(host, ())
        if self._wildcard:
            candidates += tuple(
                (f, op)
                for suffix, f, op in self._wildcard
                if (host.endswith(suffix.split(":")[0]) and (":" not in suffix or suffix.endswith(f":{port}")))
            )
        return candidates

    def files_for(self, host: str, port: int) -> list[RuleFile]:
        """The rules files that name this host."""
        return list({id(f): f for f, _ in self._candidates(host, port)}.values())

    def post_reads(self, api: str) -> tuple[PathTemplate, ...]:
        """The POST paths an API's file declares to be reads (`post_reads:`)."""
        return next((f.post_reads for f in self.files if f.api == api), ())

    def operation(self, api: str, name: str) -> Operation | None:
        for f in self.files:
            if f.api == api:
                return next((op for op in f.operations if op.name == name), None)
        return None

    def match(self, host: str, port: int, method: str, path: str, body: bytes | None = None) -> Match | None:
        """
        The first operation whose host, method and path template fit, or None. A GraphQL
        operation (`match.graphql`) also needs the body: without one, the first such candidate
        comes back `pending`; with one, only the mutation with that root field fits.
        """
        candidates = self._candidates(host, port)
        if not candidates:
            return None
        path = path.split("?", 1)[0]
        mutation: dict[str, dict[str, Any]] | None = None
        parsed = False
        for _, op in candidates:
            if op.method == method:
                params = op.path.match(path)
                if params is None:
                    continue
                if op.graphql is None:
                    return Match(op, params)
                if body is None:
                    return Match(op, params, pending=True)
                if not parsed:
                    from proxy_addon.gql import mutation_fields  # graphql-core loads only for GraphQL rules

                    mutation, parsed = mutation_fields(body), True
                if mutation is not None and op.graphql in mutation:
                    return Match(op, params, graphql_args=mutation[op.graphql])
        return None


def host_pattern(host: str) -> str:
    """A rules host as a regex for mitmproxy's `allow_hosts`, which matches `host:port` strings."""
    name, _, port = host.partition(":")
    name_rx = r"(?:[^.:]+\.)+" + re.escape(name[2:]) if name.startswith("*.") else re.escape(name)
    port_rx = re.escape(port) if port else "[0-9]+"
    return rf"^{name_rx}\.?:{port_rx}$"


# --- loading -----------------------------------------------------------------------------------


class _Ctx:
    def __init__(self, source: str):
        self.source = source
        self.post_reads: tuple[PathTemplate, ...] = ()
        self.credential_headers: tuple[str, ...] = ()

    def error(self, node: yaml.Node | None, field_: str, message: str) -> RulesError:
        line = node.start_mark.line + 1 if node is not None else None
        return RulesError(message, source=self.source, line=line, field=field_)

    def mapping(self, node: yaml.Node, field_: str, allowed: Iterable[str], required: Iterable[str] = ()) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, field_, f"expected a mapping, got {_kind(node)}")
        allowed = tuple(allowed)
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                raise self.error(key, field_, "keys must be plain strings")
            name = key.value
            where = f"{field_}.{name}" if field_ else name
            if name in out:
                raise self.error(key, where, "duplicate key")
            if name not in allowed:
                raise self.error(key, where, f"unknown key {name!r}; expected one of: {', '.join(allowed)}")
            out[name] = (key, value)
        for name in required:
            if name not in out:
                raise self.error(node, f"{field_}.{name}" if field_ else name, "is required")
        return out

    def entries(self, node: yaml.Node, field_: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """A mapping whose keys are the user's own (operation names, fields, headers)."""
        keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)] if isinstance(node, yaml.MappingNode) else []
        return self.mapping(node, field_, keys)

    def string(self, node: yaml.Node, field_: str) -> str:
        if not isinstance(node, yaml.ScalarNode) or node.tag != "tag:yaml.org,2002:str" or node.value == "":
            raise self.error(node, field_, f"expected a non-empty string, got {_kind(node)}")
        return node.value

    def strings(self, node: yaml.Node, field_: str, *, allow_empty: bool = True) -> list[tuple[yaml.Node, str]]:
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:str":
            items = [node]
        elif isinstance(node, yaml.SequenceNode):
            items = node.value
        else:
            raise self.error(node, field_, f"expected a list of strings, got {_kind(node)}")
        if not items and not allow_empty:
            raise self.error(node, field_, "must not be empty")
        out = []
        seen = set()
        for i, item in enumerate(items):
            value = self.string(item, f"{field_}[{i}]")
            if value in seen:
                raise self.error(item, f"{field_}[{i}]", f"{value!r} is listed twice")
            seen.add(value)
            out.append((item, value))
        return out


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    tag = node.tag.rsplit(":", 1)[-1]
    if tag == "null" or node.value == "":
        return "nothing"
    return f"{tag} {node.value!r}"


def parse_path_template(template: str) -> PathTemplate:
    """Compile `/api/articles/{id}` into a matcher. Raises ValueError with the reason."""
    if not template.startswith("/"):
        raise ValueError(f"path template {template!r} must start with '/'")
    if "?" in template or "#" in template:
        raise ValueError(
            f"path template {template!r} contains a query or fragment; match the path only and list query parameters under fingerprint.query"
        )
    params: list[str] = []
    pattern = ""
    pos = 0
    for m in _PARAM.finditer(template):
        literal = template[pos : m.start()]
        if "{" in literal or "}" in literal:
            raise ValueError(f"unbalanced '{{' or '}}' in path template {template!r}")
        name = m.group(1)
        if not _IDENT.match(name):
            raise ValueError(f"parameter {{{name}}} in path template {template!r} is not a valid name (letters, digits, _)")
        if name in params:
            raise ValueError(f"parameter {{{name}}} appears twice in path template {template!r}")
        params.append(name)
        pattern += re.escape(literal) + f"(?P<{name}>[^/]+)"
        pos = m.end()
    rest = template[pos:]
    if "{" in rest or "}" in rest:
        raise ValueError(f"unbalanced '{{' or '}}' in path template {template!r}")
    pattern += re.escape(rest.rstrip("/")) + "/?"  # '/api/articles/' is the same route as '/api/articles'
    return PathTemplate(template, tuple(params), re.compile(pattern))


def load_rules(text: str, source: str = "<rules>") -> RuleFile:
    """Parse one rules file. Raises RulesError naming `source`, the line and the field (the first problem)."""
    problems: list[RulesError] = []
    rf = _load(text, source, problems)
    if problems:
        raise problems[0]
    assert rf is not None
    return rf


def check_rules(text: str, source: str = "<rules>") -> list[RulesError]:
    """Every problem of one rules file: the first at the top level, else one per bad operation."""
    problems: list[RulesError] = []
    _load(text, source, problems)
    return problems


def _load(text: str, source: str, problems: list[RulesError]) -> RuleFile | None:
    try:
        return _load_file(text, source, problems)
    except RulesError as e:
        problems.append(e)
        return None


def _load_file(text: str, source: str, problems: list[RulesError]) -> RuleFile | None:
    ctx = _Ctx(source)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        problem = getattr(e, "problem", None) or str(e).split("\n", 1)[0]
        line = mark.line + 1 if mark else None
        if isinstance(e, yaml.reader.ReaderError) and isinstance(e.position, int):
            line = text.count("\n", 0, e.position) + 1
        raise RulesError(f"not valid YAML: {problem}", source=source, line=line) from None
    except RecursionError:
        raise RulesError("not valid YAML: nested too deeply", source=source) from None
    if node is None:
        raise RulesError("the file is empty; expected keys api, hosts and operations", source=source, line=1)
    top = ctx.mapping(node, "", KEYS["file"], ("api", "hosts", "operations"))

    api = ctx.string(top["api"][1], "api")
    hosts = []
    for item, host in ctx.strings(top["hosts"][1], "hosts", allow_empty=False):
        if not _HOST.match(host) or (":" in host and not 1 <= int(host.rsplit(":", 1)[1]) <= 65535):
            raise ctx.error(item, "hosts", f"{host!r} is not a host name (lower case, optional '*.' prefix and ':port')")
        hosts.append(host)

    credential_headers: tuple[str, ...] = ()
    credentials_env = credentials_scheme = None
    if "credentials" in top:
        cred = ctx.mapping(top["credentials"][1], "credentials", KEYS["credentials"], ("header",))
        names = []
        for item, h in ctx.strings(cred["header"][1], "credentials.header", allow_empty=False):
            if not _HEADER.match(h):
                raise ctx.error(item, "credentials.header", f"{h!r} is not a valid header name")
            names.append(h.lower())
        credential_headers = ctx.credential_headers = tuple(names)
        if "env" in cred:
            credentials_env = ctx.string(cred["env"][1], "credentials.env")
            if not _IDENT.match(credentials_env):
                raise ctx.error(cred["env"][1], "credentials.env", f"{credentials_env!r} is not an environment variable name")
        if "scheme" in cred:
            credentials_scheme = ctx.string(cred["scheme"][1], "credentials.scheme")
            if not _HEADER.match(credentials_scheme):
                raise ctx.error(cred["scheme"][1], "credentials.scheme", f"{credentials_scheme!r} is not an auth scheme like Bearer or Token")

    post_reads = []
    for item, template in ctx.strings(top["post_reads"][1], "post_reads") if "post_reads" in top else ():
        try:
            post_reads.append(parse_path_template(template))
        except ValueError as e:
            raise ctx.error(item, "post_reads", str(e)) from None
    ctx.post_reads = tuple(post_reads)

    ops_node = top["operations"][1]
    if not isinstance(ops_node, yaml.MappingNode):
        raise ctx.error(ops_node, "operations", f"expected a mapping of operation names, got {_kind(ops_node)}")
    ops_map = ctx.entries(ops_node, "operations")
    if not ops_map:
        raise ctx.error(ops_node, "operations", "must list at least one operation")
    operations = []
    for name, (key, value) in ops_map.items():
        try:
            if not _OPERATION_NAME.match(name):
                raise ctx.error(key, f"operations.{name}", "operation names use letters, digits, '.', '_' and '-'")
            op = _operation(ctx, api, name, value, credential_headers, credentials_env)
        except RulesError as e:
            problems.append(e)  # go on: `receipts rules check` reports every bad operation
            continue
        operations.append(replace(op, credentials_scheme=credentials_scheme, line=key.start_mark.line + 1))
    if problems:
        return None
    return RuleFile(api=api, hosts=tuple(hosts), operations=tuple(operations), source=source,
                    post_reads=tuple(post_reads))


def _operation(ctx: _Ctx, api: str, name: str, node: yaml.Node, credential_headers: tuple[str, ...],
               credentials_env: str | None = None) -> Operation:
    f = f"operations.{name}"
    op = ctx.mapping(node, f, KEYS["operation"], ("match",))
    description = ctx.string(op["description"][1], f"{f}.description") if "description" in op else None
    m = ctx.mapping(op["match"][1], f"{f}.match", KEYS["match"], ("method", "path"))
    method_node = m["method"][1]
    method = ctx.string(method_node, f"{f}.match.method").upper()
    if method not in METHODS:
        raise ctx.error(method_node, f"{f}.match.method", f"{method!r} is not one of {', '.join(METHODS)}")
    path_node = m["path"][1]
    try:
        path = parse_path_template(ctx.string(path_node, f"{f}.match.path"))
    except ValueError as e:
        raise ctx.error(path_node, f"{f}.match.path", str(e)) from None

    graphql = None
    if "graphql" in m:
        graphql = ctx.string(m["graphql"][1], f"{f}.match.graphql")
        if not _IDENT.match(graphql):
            raise ctx.error(m["graphql"][1], f"{f}.match.graphql", f"{graphql!r} is not a GraphQL field name like issueCreate")
        if method != "POST":
            raise ctx.error(m["graphql"][1], f"{f}.match.graphql", "GraphQL mutations are POSTs; use method: POST")

    fp = _fingerprint(ctx, f, op["fingerprint"][1] if "fingerprint" in op else None, path, credential_headers)

    external_id = external_id_header = None
    if "external_id" in op:
        enode = op["external_id"][1]
        if isinstance(enode, yaml.MappingNode):
            e = ctx.mapping(enode, f"{f}.external_id", KEYS["external_id"], ("header",))
            external_id_header = ctx.string(e["header"][1], f"{f}.external_id.header")
            if not _HEADER.match(external_id_header):
                raise ctx.error(e["header"][1], f"{f}.external_id.header", f"{external_id_header!r} is not a valid header name")
            external_id_header = external_id_header.lower()
        else:
            external_id = _fields(ctx, enode, f"{f}.external_id")

    after_success: AfterSuccess = "replay"
    if "after_success" in op:
        v = ctx.string(op["after_success"][1], f"{f}.after_success")
        if v not in AFTER_SUCCESS:
            raise ctx.error(op["after_success"][1], f"{f}.after_success", f"{v!r} is not one of {', '.join(AFTER_SUCCESS)}")
        after_success = v  # type: ignore[assignment]

    classify: list[tuple[str, str]] = []
    classify_rules: list[ClassifyRule] = []
    if "classify" in op and isinstance(op["classify"][1], yaml.SequenceNode):
        classify_rules = [_classify_rule(ctx, item, f"{f}.classify[{i}]") for i, item in enumerate(op["classify"][1].value)]
        if not classify_rules:
            raise ctx.error(op["classify"][1], f"{f}.classify", "must list at least one rule")
    elif "classify" in op:
        cnode = op["classify"][1]
        for status, (knode, vnode) in ctx.entries(cnode, f"{f}.classify").items():
            where = f"{f}.classify.{status}"
            classify.append((_status_key(ctx, knode, status, where), _verdict(ctx, vnode, where)))
        classify.sort(key=lambda kv: kv[0].endswith("xx"))  # exact codes first

    idempotency_header = idempotency_body = None
    idempotency_format = "receipt"
    idempotency_ttl = 0
    if "idempotency_key" in op:
        knode = op["idempotency_key"][1]
        where = f"{f}.idempotency_key"
        key = ctx.mapping(knode, where, KEYS["idempotency_key"])
        if ("header" in key) == ("body" in key):
            raise ctx.error(knode, where, "name exactly one place for the key: header (Idempotency-Key) or body (a dotted field)")
        if "header" in key:
            idempotency_header = ctx.string(key["header"][1], f"{where}.header")
            if not _HEADER.match(idempotency_header):
                raise ctx.error(key["header"][1], f"{where}.header", f"{idempotency_header!r} is not a valid header name")
        else:
            idempotency_body = ctx.string(key["body"][1], f"{where}.body")
            if not _DOTTED.match(idempotency_body) or any(p.isdecimal() for p in idempotency_body.split(".")):
                raise ctx.error(key["body"][1], f"{where}.body", f"{idempotency_body!r} is not a dotted field path like 'input.id'")
            if graphql and "." not in idempotency_body:
                raise ctx.error(key["body"][1], f"{where}.body", "for a GraphQL operation, name a field inside an argument, like 'input.id'")
        if "ttl" in key:
            idempotency_ttl = _duration(ctx, key["ttl"][1], f"{where}.ttl")
            if idempotency_ttl <= 0:
                raise ctx.error(key["ttl"][1], f"{where}.ttl", "must be longer than 0s")
        if "format" in key:
            idempotency_format = ctx.string(key["format"][1], f"{where}.format")
            if idempotency_format not in ("receipt", "uuid4"):
                raise ctx.error(key["format"][1], f"{where}.format", f"{idempotency_format!r} is not one of receipt, uuid4")

    reconcile = (_reconcile(ctx, f, op["reconcile"][1], fp, external_id, idempotent=bool(idempotency_header or idempotency_body))
                 if "reconcile" in op else None)
    for state in (*(r.state for r in classify_rules), *(v for _, v in classify)):
        if state == ALREADY_EXISTS and reconcile is None:
            problem = "an already_exists answer needs a reconcile read to decide; add reconcile: to this operation"
            raise ctx.error(op["classify"][1], f"{f}.classify", problem)

    approve = _boolean(ctx, op["approve"][1], f"{f}.approve") if "approve" in op else False

    return Operation(
        api=api, name=name, method=method, path=path, fingerprint=fp,
        credential_headers=credential_headers, external_id=external_id,
        after_success=after_success, classify=tuple(classify), source=ctx.source,
        reconcile=reconcile, idempotency_header=idempotency_header, credentials_env=credentials_env,
        approve=approve, graphql=graphql, classify_rules=tuple(classify_rules),
        external_id_header=external_id_header, idempotency_body=idempotency_body,
        idempotency_format=idempotency_format, description=description, idempotency_ttl=idempotency_ttl,
    )


def _fields(ctx: _Ctx, node: yaml.Node, field_: str, templates: set[str] | None = None) -> str | tuple[str, ...]:
    """A dotted field path, or a list of them (a composite id, joined with ':'). With `templates`,
    a list item may be a template of the receipt (`{intent.channel}`), for reads whose items lack a part."""
    if isinstance(node, yaml.SequenceNode):
        items = ctx.strings(node, field_, allow_empty=False)
    else:
        items = [(node, ctx.string(node, field_))]
    for item, name in items:
        if templates is not None and isinstance(node, yaml.SequenceNode) and _TEMPLATE_VAR.fullmatch(name):
            _template(ctx, item, field_, templates)
        elif not _DOTTED.match(name) or "{" in name:
            raise ctx.error(item, field_, f"{name!r} is not a dotted field path like 'id' or 'data.id'")
    names = tuple(name for _, name in items)
    return names[0] if not isinstance(node, yaml.SequenceNode) else names


def _status_key(ctx: _Ctx, node: yaml.Node, status: str, field_: str) -> str:
    if not _STATUS_KEY.match(status.lower()):
        raise ctx.error(node, field_, f"{status!r} is not a status code (like 409) or class (like 4xx)")
    return status.lower()


def _verdict(ctx: _Ctx, node: yaml.Node, field_: str) -> str:
    state = ctx.string(node, field_)
    allowed = (*CLASSIFIABLE, ALREADY_EXISTS)
    if state not in allowed:
        raise ctx.error(node, field_, f"{state!r} is not one of {', '.join(allowed)}")
    return state if state == ALREADY_EXISTS else State(state)


def _scalar(node: yaml.Node) -> Any:
    """A YAML scalar as the JSON value it stands for."""
    if node.tag == "tag:yaml.org,2002:str":
        return node.value
    return yaml.safe_load(node.value)


def _check(ctx: _Ctx, node: yaml.Node, field_: str) -> Check:
    if isinstance(node, yaml.ScalarNode):
        return Check("equal", _scalar(node))
    if isinstance(node, yaml.SequenceNode):
        values = []
        for i, item in enumerate(node.value):
            if not isinstance(item, yaml.ScalarNode):
                raise ctx.error(item, f"{field_}[{i}]", f"expected a value, got {_kind(item)}")
            values.append(_scalar(item))
        if not values:
            raise ctx.error(node, field_, "must list at least one value")
        return Check("one_of", tuple(values))
    test = ctx.mapping(node, field_, KEYS["check"])
    if len(test) != 1:
        raise ctx.error(node, field_, f"expected one test: {', '.join(KEYS['check'])}")
    (kind, (_, vnode)), = test.items()
    where = f"{field_}.{kind}"
    if kind == "present":
        return Check(kind, _boolean(ctx, vnode, where))
    text = ctx.string(vnode, where)
    if kind == "matches":
        try:
            return Check(kind, re.compile(text))
        except re.error as e:
            raise ctx.error(vnode, where, f"{text!r} is not a valid regular expression: {e}") from None
    return Check(kind, text)


def _checks(ctx: _Ctx, rule: dict, key: str, field_: str, valid: re.Pattern[str], invalid: str) -> list[tuple[str, Check]]:
    """A rule's `body` or `headers`: name → test, each name checked against `valid`."""
    out = []
    for name, (knode, vnode) in ctx.entries(rule[key][1], f"{field_}.{key}").items() if key in rule else ():
        if not valid.match(name):
            raise ctx.error(knode, f"{field_}.{key}.{name}", f"{name!r} {invalid}")
        out.append((name, _check(ctx, vnode, f"{field_}.{key}.{name}")))
    return out


def _classify_rule(ctx: _Ctx, node: yaml.Node, field_: str, *, verdict: bool = True) -> ClassifyRule:
    keys = KEYS["classify_rule"] if verdict else KEYS["absent_when"]
    rule = ctx.mapping(node, field_, keys, ("state",) if verdict else ())
    statuses: list[str] = []
    if "status" in rule:
        snode = rule["status"][1]
        items = snode.value if isinstance(snode, yaml.SequenceNode) else [snode]
        for i, item in enumerate(items):
            where = f"{field_}.status" + (f"[{i}]" if isinstance(snode, yaml.SequenceNode) else "")
            if not isinstance(item, yaml.ScalarNode) or not item.value:
                raise ctx.error(item, where, f"expected a status code (like 409) or class (like 4xx), got {_kind(item)}")
            statuses.append(_status_key(ctx, item, item.value, where))
    body = _checks(ctx, rule, "body", field_, _DOTTED, "is not a dotted field path (use * for any item of a list)")
    headers = [(name.lower(), check) for name, check in
               _checks(ctx, rule, "headers", field_, _HEADER, "is not a valid header name")]
    if not (statuses or body or headers):
        raise ctx.error(node, field_, "a rule that tests nothing fits every answer; give status, body or headers")
    reason = ctx.string(rule["reason"][1], f"{field_}.reason") if "reason" in rule else None
    state = _verdict(ctx, rule["state"][1], f"{field_}.state") if verdict else ""
    return ClassifyRule(state=state, statuses=tuple(statuses),
                        body=tuple(body), headers=tuple(headers), reason=reason, line=node.start_mark.line + 1)


_TEMPLATE_VAR = re.compile(r"\{([^{}]*)\}")


def template_variables(fp: FingerprintSpec) -> set[str]:
    """The names a reconcile template may use, given what the operation's fingerprint records."""
    names = {"external_id", "idempotency_key", "submitted_at", "submitted_at_unix"}
    names |= {f"path.{p}" for p in fp.path}
    names |= {f"query.{q}" for q in fp.query}
    names |= {f"header.{h}" for h in fp.headers}
    names |= {f"intent.{b}" for b in fp.body or ()}
    return names


def _template(ctx: _Ctx, node: yaml.Node, field_: str, allowed: set[str]) -> str:
    text = ctx.string(node, field_)
    stripped = _TEMPLATE_VAR.sub("", text)
    if "{" in stripped or "}" in stripped:
        raise ctx.error(node, field_, f"unbalanced '{{' or '}}' in template {text!r}")
    for var in _TEMPLATE_VAR.findall(text):
        if var not in allowed:
            known = ", ".join(sorted(allowed))
            raise ctx.error(node, field_, f"{{{var}}} is not recorded by this operation's fingerprint; "
                                          f"templates may use: {known}")
    return text


def _boolean(ctx: _Ctx, node: yaml.Node, field_: str) -> bool:
    if not isinstance(node, yaml.ScalarNode) or node.tag != "tag:yaml.org,2002:bool":
        raise ctx.error(node, field_, f"expected true or false, got {_kind(node)}")
    return node.value.lower() in ("true", "yes", "on")


_DURATION = re.compile(r"^([0-9]+)\s*(s|m|h|d)?\Z")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def _duration(ctx: _Ctx, node: yaml.Node, field_: str) -> int:
    text = node.value if isinstance(node, yaml.ScalarNode) else ""
    m = _DURATION.match(text.strip())
    if not m or node.tag not in ("tag:yaml.org,2002:str", "tag:yaml.org,2002:int"):
        raise ctx.error(node, field_, f"expected a duration like 30s, 5m, 1h or 1d, got {_kind(node)}")
    return int(m.group(1)) * _UNIT[m.group(2)]


def _read_body(ctx: _Ctx, node: yaml.Node, field_: str, allowed: set[str]) -> Any:
    """A POST read's JSON body: its strings may be templates."""
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key, value in node.value:
            name = ctx.string(key, field_)
            out[name] = _read_body(ctx, value, f"{field_}.{name}", allowed)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_read_body(ctx, item, f"{field_}[{i}]", allowed) for i, item in enumerate(node.value)]
    if node.tag == "tag:yaml.org,2002:str":
        return _template(ctx, node, field_, allowed)
    return _scalar(node)


def _reconcile(ctx: _Ctx, f: str, node: yaml.Node, fp: FingerprintSpec, external_id: str | tuple[str, ...] | None,
               idempotent: bool = False) -> ReconcileSpec:
    f = f"{f}.reconcile"
    rec = ctx.mapping(node, f, KEYS["reconcile"], ("read",))
    allowed = template_variables(fp)
    if not idempotent:
        allowed.discard("idempotency_key")
    read = ctx.mapping(rec["read"][1], f"{f}.read", KEYS["read"], ("url",))
    method = "GET"
    if "method" in read:
        method = ctx.string(read["method"][1], f"{f}.read.method").upper()
        if method not in ("GET", "HEAD", "POST"):
            raise ctx.error(read["method"][1], f"{f}.read.method",
                            f"{method!r}: a reconcile read is GET or HEAD (or a POST to a path listed in post_reads), never a write")
    url = _template(ctx, read["url"][1], f"{f}.read.url", allowed)
    if not (url.startswith("/") or re.match(r"^https?://[^/{}]+", url)):
        raise ctx.error(read["url"][1], f"{f}.read.url", f"{url!r} must be a path ('/api/...') or an http(s) URL with a fixed host")
    headers = []
    if "headers" in read:
        hnode = read["headers"][1]
        for name, (knode, vnode) in ctx.entries(hnode, f"{f}.read.headers").items():
            where = f"{f}.read.headers.{name}"
            if not _HEADER.match(name):
                raise ctx.error(knode, where, f"{name!r} is not a valid header name")
            low = name.lower()
            if low in ALWAYS_SECRET_HEADERS or low in ctx.credential_headers or SECRET_NAME.search(low):
                raise ctx.error(knode, where, f"{name!r} carries credentials: a read sends the request's own "
                                              "(credentials.header), never a value written in a rules file")
            headers.append((low, _template(ctx, vnode, where, allowed)))
    body = None
    if method == "POST":
        path = re.sub(r"^https?://[^/]+", "", _TEMPLATE_VAR.sub("x", url)).split("?", 1)[0] or "/"
        if not any(t.match(path) is not None for t in ctx.post_reads):
            listed = ", ".join(t.template for t in ctx.post_reads) or "none"
            raise ctx.error(read["method"][1], f"{f}.read.method",
                            f"a reconcile read is GET or HEAD, never a write; a POST read is allowed only to a path listed in post_reads (listed: {listed}); "
                            f"{url!r} is not one of them")
        if "body" not in read:
            raise ctx.error(rec["read"][1], f"{f}.read.body", "a POST read needs a body (a mapping, sent as JSON)")
        bnode = read["body"][1]
        if not isinstance(bnode, yaml.MappingNode):
            raise ctx.error(bnode, f"{f}.read.body", f"expected a mapping, got {_kind(bnode)}")
        body = {}
        for key, value in bnode.value:
            name = ctx.string(key, f"{f}.read.body")
            if name == "query":  # a GraphQL document is sent as written; values go in variables
                from proxy_addon.gql import read_is_query

                body[name] = ctx.string(value, f"{f}.read.body.query")
                if (why := read_is_query(body[name])) is not None:
                    raise ctx.error(value, f"{f}.read.body.query", why)
            else:
                body[name] = _read_body(ctx, value, f"{f}.read.body.{name}", allowed)
    elif "body" in read:
        raise ctx.error(read["body"][1], f"{f}.read.body", f"a {method} read has no body; only a POST read does")
    find: list[tuple[str, str]] = []
    bounds: list[tuple[str, str, str]] = []
    if "find" in rec:
        fnode = rec["find"][1]
        for name, (knode, vnode) in ctx.entries(fnode, f"{f}.find").items():
            where = f"{f}.find.{name}"
            if not _DOTTED.match(name):
                raise ctx.error(knode, where, f"{name!r} is not a dotted field path")
            if isinstance(vnode, yaml.MappingNode):  # {gte: "{submitted_at_unix}"}: a bound, not a value
                test = ctx.mapping(vnode, where, ("gte", "lte"))
                if not test:
                    raise ctx.error(vnode, where, "expected gte or lte")
                for kind, (_, bnode) in test.items():
                    bounds.append((name, kind, _template(ctx, bnode, f"{where}.{kind}", allowed)))
            else:
                find.append((name, _template(ctx, vnode, where, allowed)))
        if not find and not bounds:
            raise ctx.error(fnode, f"{f}.find", "must name at least one field; leave find out to let the read's status decide")
        if method == "HEAD":
            raise ctx.error(fnode, f"{f}.find", "a HEAD read has no body to search; use GET or leave find out")
    items = ctx.string(rec["items"][1], f"{f}.items") if "items" in rec else None
    absent_when = _classify_rule(ctx, rec["absent_when"][1], f"{f}.absent_when", verdict=False) if "absent_when" in rec else None
    provable = _boolean(ctx, rec["absence_provable"][1], f"{f}.absence_provable") if "absence_provable" in rec else False
    settle = _duration(ctx, rec["settle"][1], f"{f}.settle") if "settle" in rec else 0
    if "settle" in rec and not provable:
        raise ctx.error(rec["settle"][1], f"{f}.settle", "needs absence_provable: true; settle says when absence counts")
    retry = _boolean(ctx, rec["retry_when_absent"][1], f"{f}.retry_when_absent") if "retry_when_absent" in rec else False
    if retry and not provable:
        raise ctx.error(rec["retry_when_absent"][1], f"{f}.retry_when_absent",
                        "needs absence_provable: true; a retry is safe only when absence is proven")
    rec_external_id = (_fields(ctx, rec["external_id"][1], f"{f}.external_id", allowed) if "external_id" in rec
                       else external_id)
    return ReconcileSpec(method=method, url=url, find=tuple(find), items=items, absence_provable=provable,
                         retry_when_absent=retry, external_id=rec_external_id, body=body, settle=settle,
                         absent_when=absent_when, headers=tuple(headers), bounds=tuple(bounds))


def _fingerprint(ctx: _Ctx, f: str, node: yaml.Node | None, path: PathTemplate, credential_headers: tuple[str, ...]) -> FingerprintSpec:
    if node is None:
        return FingerprintSpec(path=path.params, body=None)
    fp = ctx.mapping(node, f"{f}.fingerprint", KEYS["fingerprint"])
    path_params = path.params
    if "path" in fp:
        path_params = []
        for item, p in ctx.strings(fp["path"][1], f"{f}.fingerprint.path"):
            if p not in path.params:
                known = ", ".join(path.params) or "none"
                raise ctx.error(item, f"{f}.fingerprint.path", f"{p!r} is not a parameter of {path.template!r} (it has: {known})")
            path_params.append(p)
    body = None
    if "body" in fp:
        body = []
        for item, b in ctx.strings(fp["body"][1], f"{f}.fingerprint.body"):
            if not _DOTTED.match(b):
                raise ctx.error(item, f"{f}.fingerprint.body", f"{b!r} is not a dotted field path like 'article.title'")
            if any(SECRET_NAME.search(part) for part in b.split(".")):
                raise ctx.error(item, f"{f}.fingerprint.body", f"{b!r} looks like a credential; secrets never enter a fingerprint")
            body.append(b)
    query = []
    for item, q in ctx.strings(fp["query"][1], f"{f}.fingerprint.query") if "query" in fp else ():
        if SECRET_NAME.search(q):
            raise ctx.error(item, f"{f}.fingerprint.query", f"{q!r} looks like a credential; secrets never enter a fingerprint")
        query.append(q)
    headers = []
    for item, h in ctx.strings(fp["headers"][1], f"{f}.fingerprint.headers") if "headers" in fp else ():
        low = h.lower()
        if not _HEADER.match(h):
            raise ctx.error(item, f"{f}.fingerprint.headers", f"{h!r} is not a valid header name")
        if low in ALWAYS_SECRET_HEADERS or low in credential_headers or SECRET_NAME.search(low):
            raise ctx.error(item, f"{f}.fingerprint.headers", f"{h!r} carries credentials; secrets never enter a fingerprint")
        headers.append(low)
    return FingerprintSpec(
        path=tuple(path_params), body=None if body is None else tuple(body),
        query=tuple(query), headers=tuple(headers),
    )


def load_rules_path(path: str | Path) -> RuleSet:
    """Load one rules file, or every `*.yaml`/`*.yml` file in a folder (sorted by name).
    Raises the first problem (`check_rules_path` lists them all)."""
    _, loaded, problems = _load_path(path)
    if problems:
        raise problems[0]
    return RuleSet.of(loaded)


def check_rules_path(path: str | Path) -> tuple[list[Path], list[RulesError]]:
    """The files checked and every problem found in them (`receipts rules check`)."""
    files, _, problems = _load_path(path)
    return files, problems


def rules_files(path: str | Path) -> list[Path]:
    """The rules files a path names: itself, or every *.yaml/*.yml in a folder, sorted."""
    p = Path(path).expanduser()
    if p.is_dir():
        return sorted(x for x in p.iterdir() if x.suffix in (".yaml", ".yml") and x.is_file())
    return [p] if p.is_file() else []


def _load_path(path: str | Path) -> tuple[list[Path], list[RuleFile], list[RulesError]]:
    """Every rules file a path names, those that loaded, and every problem, in file order."""
    files = rules_files(path)
    if not files:
        p = Path(path).expanduser()
        what = "no *.yaml rules files in this folder" if p.is_dir() else "no such rules file or folder"
        return [], [], [RulesError(what, source=str(p))]
    loaded: list[RuleFile] = []
    problems: list[RulesError] = []
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            problems.append(RulesError(f"cannot read: {e}", source=str(file)))
            continue
        rf = _load(text, str(file), problems)
        if rf is None:
            continue
        other = next((o for o in loaded if o.api == rf.api), None)
        if other is not None:
            problems.append(RulesError(f"api {rf.api!r} is already defined in {other.source}", source=str(file), field="api"))
            continue
        loaded.append(rf)
    return files, loaded, problems


def rules_signature(path: str | Path) -> tuple:
    """What changes when a rules file is edited, added or removed: names, sizes and mtimes."""
    try:
        return tuple((str(x), x.stat().st_mtime_ns, x.stat().st_size) for x in rules_files(path))
    except OSError:
        return ()
