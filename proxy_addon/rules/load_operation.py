"""
Loading one operation of a rules file: what it matches, what identifies its intent, how its
answers are classified and how an unknown outcome is resolved.

    articles.create:
      match: {method: POST, path: /api/articles}
      fingerprint: {body: [article.title, article.body_markdown]}
      external_id: id

Credentials (`credentials:` of the file, and of an operation, which adds to the file's) are read
by `load_credentials`: the headers, query parameters, body fields and path parameters that
carry them, hashed into the principal and never stored (intent/caller.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import yaml

from proxy_addon.rules.load_budgets import load_budgets
from proxy_addon.rules.load_classify import load_classify
from proxy_addon.rules.load_decisions import load_decisions
from proxy_addon.rules.load_reconcile import load_reconcile
from proxy_addon.rules.model import (
    AFTER_SUCCESS,
    ALREADY_EXISTS,
    IDENT,
    KEYS,
    METHOD_OVERRIDE,
    METHODS,
    AfterSuccess,
    Budget,
    DecisionRule,
    FingerprintSpec,
    Operation,
    PathTemplate,
    ReconcileSpec,
    parse_path_template,
    path_alternatives,
)
from proxy_addon.rules.nodes import DOTTED, HEADER, Ctx, Entry, scalar_value
from proxy_addon.wire.redaction import is_credential_param, is_secret_header, is_secret_name


@dataclass(frozen=True)
class Declared:
    """The credentials a `credentials:` mapping declares, by where they are in a request."""

    header: tuple[str, ...] = ()  # lower-case header names
    query: tuple[str, ...] = ()  # query parameter names
    body: tuple[str, ...] = ()  # body fields: a form's names, dotted paths into JSON
    path: tuple[str, ...] = ()  # path parameters

    def plus(self, other: Declared) -> Declared:
        """These and `other`'s (an operation's own added to its file's), each name once."""
        return Declared(*(tuple(dict.fromkeys((*a, *b))) for a, b in zip(self.places(), other.places(), strict=True)))

    def places(self) -> tuple[tuple[str, ...], ...]:
        return (self.header, self.query, self.body, self.path)


PLACES = ("header", "query", "body", "path")
OPERATION_CREDENTIALS = KEYS["operation_credentials"]


def load_credentials(ctx: Ctx, node: yaml.Node, where: str, allowed: tuple[str, ...]) -> Declared:
    """
    `credentials: {header, query, body, path}` (a name or a list of names each; the file's may
    also say `env` and `scheme`, read by loader.py): at least one place. Each bad name is
    reported and the next one read.
    """
    return declared_in(ctx, node, ctx.mapping(node, where, allowed), where)


def declared_in(ctx: Ctx, node: yaml.Node, cred: dict[str, Entry], where: str) -> Declared:
    """The places of a `credentials:` mapping already read (`cred`), as load_credentials reads them."""
    if not any(place in cred for place in PLACES):
        raise ctx.error(node, where, f"name at least one of {', '.join(PLACES)}")
    found: dict[str, list[str]] = {place: [] for place in PLACES}
    checks = {
        "header": (HEADER, "is not a valid header name"),
        "body": (DOTTED, "is not a field name or a dotted path like 'auth.client_secret'"),
        "path": (IDENT, "is not a path parameter name (letters, digits, _)"),
    }
    for place in PLACES:
        if place not in cred:
            continue
        for item, name in ctx.attempt(ctx.strings, cred[place][1], f"{where}.{place}", allow_empty=False) or ():
            pattern, problem = checks.get(place, (None, ""))
            if pattern is not None and not pattern.match(name):
                ctx.report(ctx.error(item, f"{where}.{place}", f"{name!r} {problem}"))
                continue
            found[place].append(name.lower() if place == "header" else name)
    return Declared(*(tuple(found[place]) for place in PLACES))


def load_operation(
    ctx: Ctx,
    api: str,
    name: str,
    node: yaml.Node,
    credentials: tuple[str, ...] | Declared,
    credentials_env: str | None = None,
) -> Operation | None:
    """
    One entry of `operations:`. Each part is checked even when another has a problem (every one
    goes to `ctx.problems`); None if there was any. What depends on a part that has a problem is
    left unchecked: the fingerprint's path parameters on a path that does not parse, the names
    in reconcile templates on a fingerprint that does not load. `credentials`: the file's (a
    tuple: its headers only); the operation's own `credentials:` add to them.
    """
    file_headers = ctx.credential_headers
    try:
        return _operation(ctx, api, name, node, credentials, credentials_env)
    finally:  # the operation's own credentials were in force while it loaded
        ctx.credential_headers, ctx.credential_params = file_headers, frozenset()


def _operation(
    ctx: Ctx,
    api: str,
    name: str,
    node: yaml.Node,
    credentials: tuple[str, ...] | Declared,
    credentials_env: str | None,
) -> Operation | None:
    f = f"operations.{name}"
    before = len(ctx.problems)
    op = ctx.mapping(node, f, KEYS["operation"])
    if "match" not in op:
        ctx.report(ctx.error(node, f"{f}.match", "is required"))
    description = ctx.attempt(ctx.string, op["description"][1], f"{f}.description") if "description" in op else None
    matched = ctx.attempt(_match, ctx, f, op["match"][1]) if "match" in op else None
    method, path, graphql, override, mcp = matched or (None, None, None, None, None)
    declared = _credentials_in_force(ctx, f, op, credentials, path)
    fp, fp_known = _fingerprint_of(ctx, f, op, path, declared, mcp is not None)
    external = ctx.attempt(_external_id, ctx, f, op)
    after_success = ctx.attempt(_after_success, ctx, f, op)
    classified = ctx.attempt(load_classify, ctx, op["classify"][1], f"{f}.classify") if "classify" in op else ((), ())
    idempotency = ctx.attempt(_idempotency_key, ctx, f, op, graphql)
    idempotent = bool(idempotency["idempotency_header"] or idempotency["idempotency_body"]) if idempotency else True
    reconcile = _reconcile_of(ctx, f, op, fp if fp_known else None, external, idempotent)
    if classified is not None and "reconcile" not in op:
        _already_exists_needs_a_read(ctx, f, op, classified)
    approve, record, decisions, budgets = _say(ctx, f, op, fp if fp_known else None)
    if len(ctx.problems) > before:
        return None
    assert method and path and override and fp and external and after_success and classified and idempotency
    return Operation(
        api=api,
        name=name,
        method=method,
        path=path,
        fingerprint=fp,
        credential_headers=declared.header,
        credential_query=declared.query,
        credential_body=declared.body,
        credential_path=tuple(p for p in declared.path if p in path.params),  # the file's, where this path has them
        external_id=external[0],
        after_success=after_success,
        classify=classified[0],
        source=ctx.source,
        reconcile=reconcile,
        credentials_env=credentials_env,
        approve=approve,
        record=record,
        decisions=decisions,
        budgets=budgets,
        graphql=graphql,
        mcp_tool=mcp[0] if mcp else None,
        mcp_arguments=mcp[1] if mcp else (),
        classify_rules=classified[1],
        external_id_header=external[1],
        description=description,
        method_override=override,
        **idempotency,
    )


def _say(
    ctx: Ctx, f: str, op: dict[str, Entry], fp: FingerprintSpec | None
) -> tuple[bool, bool, tuple[DecisionRule, ...], tuple[Budget, ...]]:
    """What the operator says of a write: `approve`, `record`, `decisions` and `budget` (`fp` None: not loaded)."""
    approve = ctx.attempt(ctx.boolean, op["approve"][1], f"{f}.approve") if "approve" in op else False
    record = ctx.attempt(ctx.boolean, op["record"][1], f"{f}.record") if "record" in op else True
    decisions = ctx.attempt(load_decisions, ctx, op["decisions"][1], f"{f}.decisions", fp) if "decisions" in op else ()
    budgets = ctx.attempt(load_budgets, ctx, op["budget"][1], f"{f}.budget", fp) if "budget" in op else ()
    return bool(approve), record is not False, decisions or (), budgets or ()


def _fingerprint_of(
    ctx: Ctx, f: str, op: dict[str, Entry], path: PathTemplate | None, declared: Declared, mcp: bool
) -> tuple[FingerprintSpec | None, bool]:
    """
    `fingerprint:` (an MCP tool call's: its arguments only), and whether what reconcile templates
    may name is known: the path parsed and the fingerprint loaded without a problem.
    """
    fp_node = op["fingerprint"][1] if "fingerprint" in op else None
    fp_before = len(ctx.problems)
    fp = ctx.attempt(load_fingerprint, ctx, f, fp_node, path, declared)
    if mcp and fp is not None:
        ctx.attempt(_mcp_fingerprint, ctx, f, fp_node, fp)
    return fp, path is not None and len(ctx.problems) == fp_before


def _credentials_in_force(
    ctx: Ctx, f: str, op: dict[str, Entry], credentials: tuple[str, ...] | Declared, path: PathTemplate | None
) -> Declared:
    """
    The file's credentials plus the operation's own `credentials:` (their path parameters checked
    against its path), put in force on `ctx` while the operation loads.
    """
    declared = credentials if isinstance(credentials, Declared) else Declared(header=credentials)
    if "credentials" in op:
        own = ctx.attempt(load_credentials, ctx, op["credentials"][1], f"{f}.credentials", OPERATION_CREDENTIALS)
        if own is not None and path is not None and (foreign := [p for p in own.path if p not in path.params]):
            problem = (
                f"{foreign[0]!r} is not a parameter of {path.template!r} (it has: {', '.join(path.params) or 'none'})"
            )
            ctx.report(ctx.error(op["credentials"][1], f"{f}.credentials.path", problem))
        declared = declared.plus(own or Declared())
    ctx.credential_headers = declared.header  # a credential header never enters the fingerprint or a read's headers
    # Path parameters that carry a credential whatever the request (declared, or named like one):
    # the receipt keeps a keyed hash of them, so a read cannot use them (Ctx.template).
    ctx.credential_params = frozenset(
        p for p in (path.params if path else ()) if p in declared.path or is_credential_param(p)
    )
    return declared


def _reconcile_of(
    ctx: Ctx,
    f: str,
    op: dict[str, Entry],
    fp: FingerprintSpec | None,
    external: tuple[str | tuple[str, ...] | None, str | None] | None,
    idempotent: bool,
) -> ReconcileSpec | None:
    """`reconcile:`, if the operation has one. `fp`: None when what its templates may name is not known."""
    if "reconcile" not in op:
        return None
    return ctx.attempt(load_reconcile, ctx, f, op["reconcile"][1], fp, external[0] if external else None, idempotent)


def _already_exists_needs_a_read(ctx: Ctx, f: str, op: dict[str, Entry], classified: tuple) -> None:
    """An operation without `reconcile:` cannot classify an answer as already_exists: only a read decides it."""
    classify, classify_rules = classified
    if any(state == ALREADY_EXISTS for state in (*(r.state for r in classify_rules), *(v for _, v in classify))):
        problem = "an already_exists answer needs a reconcile read to decide; add reconcile: to this operation"
        ctx.report(ctx.error(op["classify"][1], f"{f}.classify", problem))


def method_override(ctx: Ctx, node: yaml.Node, field_: str) -> str:
    """`method_override:` honour (match the method X-HTTP-Method-Override names) or refuse (answer 400)."""
    value = ctx.string(node, field_)
    if value not in METHOD_OVERRIDE:
        raise ctx.error(node, field_, f"{value!r} is not one of {', '.join(METHOD_OVERRIDE)}")
    return value


def _match(
    ctx: Ctx, f: str, node: yaml.Node
) -> tuple[str | None, PathTemplate | None, str | None, str | None, tuple[str, tuple] | None]:
    """`match:`: the method, the path template (case-sensitive unless `case_insensitive: true`), for a
    GraphQL mutation its root field, what a method override header gets (the file's unless it says),
    and for an MCP tool call its tool and argument values. Each is None when it has a problem
    (reported); the others are still read."""
    m = ctx.mapping(node, f"{f}.match", KEYS["match"], ("method", "path"))
    method = ctx.attempt(_method, ctx, m["method"][1], f"{f}.match.method")
    fold = (
        ctx.attempt(ctx.boolean, m["case_insensitive"][1], f"{f}.match.case_insensitive")
        if "case_insensitive" in m
        else False
    )
    path = ctx.attempt(_path, ctx, m["path"][1], f"{f}.match.path", bool(fold))
    graphql = ctx.attempt(_graphql, ctx, m["graphql"][1], f"{f}.match.graphql", method) if "graphql" in m else None
    mcp = ctx.attempt(_mcp, ctx, m["mcp"][1], f"{f}.match.mcp", method) if "mcp" in m else None
    if graphql is not None and mcp is not None:
        ctx.report(
            ctx.error(
                m["mcp"][1], f"{f}.match.mcp", "an operation matches a GraphQL mutation or an MCP tool call, not both"
            )
        )
    override = (
        ctx.attempt(method_override, ctx, m["method_override"][1], f"{f}.match.method_override")
        if "method_override" in m
        else ctx.method_override
    )
    return method, path, graphql, override, mcp


def _mcp(ctx: Ctx, node: yaml.Node, field_: str, method: str | None) -> tuple[str, tuple]:
    """`match.mcp: {tool, arguments}`: the tool's name, and argument values the call must have (scalars)."""
    m = ctx.mapping(node, field_, KEYS["mcp_match"], ("tool",))
    tool = ctx.string(m["tool"][1], f"{field_}.tool")
    if not tool or len(tool) > 128 or any(c.isspace() or not c.isprintable() for c in tool):
        raise ctx.error(m["tool"][1], f"{field_}.tool", f"{tool!r} is not an MCP tool name")
    if method is not None and method != "POST":
        raise ctx.error(node, field_, "MCP tool calls are POSTs to the endpoint; use method: POST")
    arguments: list[tuple[str, Any]] = []
    if "arguments" in m:
        for name, (_, value_node) in ctx.entries(m["arguments"][1], f"{field_}.arguments").items():
            value = scalar_value(value_node) if isinstance(value_node, yaml.ScalarNode) else None
            if not isinstance(value, (str, int, float, bool)):
                raise ctx.error(value_node, f"{field_}.arguments.{name}", "must be a string, number or boolean")
            arguments.append((name, value))
    return tool, tuple(arguments)


def _mcp_fingerprint(ctx: Ctx, f: str, node: yaml.Node | None, fp: FingerprintSpec) -> None:
    """An MCP operation's fingerprint reads the tool's arguments only: never the JSON-RPC id or params._meta."""
    if fp.path or fp.query:
        raise ctx.error(
            node,
            f"{f}.fingerprint",
            "an MCP tool call has one endpoint: fingerprint its arguments (body: [params.arguments.NAME])",
        )
    for b in fp.body or ():
        if not b.startswith("params.arguments."):
            raise ctx.error(
                node,
                f"{f}.fingerprint.body",
                f"{b!r} is not one of the tool's arguments; an MCP fingerprint names params.arguments.NAME "
                "(the JSON-RPC id changes on every retry)",
            )


def _method(ctx: Ctx, node: yaml.Node, field_: str) -> str:
    method = ctx.string(node, field_).upper()
    if method not in METHODS:
        raise ctx.error(node, field_, f"{method!r} is not one of {', '.join(METHODS)}")
    return method


def _path(ctx: Ctx, node: yaml.Node, field_: str, case_insensitive: bool) -> PathTemplate:
    """One path template, or a list of them (the operation at each of its paths)."""
    if not isinstance(node, yaml.SequenceNode):
        try:
            return parse_path_template(ctx.string(node, field_), case_insensitive=case_insensitive)
        except ValueError as e:
            raise ctx.error(node, field_, str(e)) from None
    parsed, problems = [], []  # each bad template is reported once, where it is
    for i, (item, template) in enumerate(ctx.strings(node, field_, allow_empty=False)):
        try:
            parsed.append(parse_path_template(template, case_insensitive=case_insensitive))
        except ValueError as e:
            problems.append(ctx.error(item, f"{field_}[{i}]", str(e)))
    for problem in problems[:-1]:
        ctx.report(problem)
    if problems:
        raise problems[-1]
    if not parsed:  # every item was refused (and reported) by ctx.strings
        raise ctx.error(node, field_, "no path template")
    return path_alternatives(parsed)


def _graphql(ctx: Ctx, node: yaml.Node, field_: str, method: str | None) -> str:
    graphql = ctx.string(node, field_)
    if not IDENT.match(graphql):
        raise ctx.error(node, field_, f"{graphql!r} is not a GraphQL field name like issueCreate")
    if method is not None and method != "POST":
        raise ctx.error(node, field_, "GraphQL mutations are POSTs; use method: POST")
    return graphql


def _external_id(ctx: Ctx, f: str, op: dict[str, Entry]) -> tuple[str | tuple[str, ...] | None, str | None]:
    """`external_id:`: the answer's field(s) naming the created object, or {header: ...} (lower-cased)."""
    external_id = external_id_header = None
    if "external_id" in op:
        enode = op["external_id"][1]
        if isinstance(enode, yaml.MappingNode):
            e = ctx.mapping(enode, f"{f}.external_id", KEYS["external_id"], ("header",))
            external_id_header = ctx.string(e["header"][1], f"{f}.external_id.header")
            if not HEADER.match(external_id_header):
                raise ctx.error(
                    e["header"][1], f"{f}.external_id.header", f"{external_id_header!r} is not a valid header name"
                )
            external_id_header = external_id_header.lower()
        else:
            external_id = ctx.fields(enode, f"{f}.external_id")
    return external_id, external_id_header


def _after_success(ctx: Ctx, f: str, op: dict[str, Entry]) -> AfterSuccess:
    after_success: AfterSuccess = "replay"
    if "after_success" in op:
        v = ctx.string(op["after_success"][1], f"{f}.after_success")
        if v not in AFTER_SUCCESS:
            raise ctx.error(
                op["after_success"][1], f"{f}.after_success", f"{v!r} is not one of {', '.join(AFTER_SUCCESS)}"
            )
        after_success = cast(AfterSuccess, v)  # checked against AFTER_SUCCESS just above
    return after_success


def _idempotency_key(ctx: Ctx, f: str, op: dict[str, Entry], graphql: str | None) -> dict[str, Any]:
    """`idempotency_key:` as the Operation's idempotency_* fields: a header or a body field, its format and ttl."""
    out: dict[str, Any] = {
        "idempotency_header": None,
        "idempotency_body": None,
        "idempotency_format": "receipt",
        "idempotency_ttl": 0,
    }
    if "idempotency_key" not in op:
        return out
    knode = op["idempotency_key"][1]
    where = f"{f}.idempotency_key"
    key = ctx.mapping(knode, where, KEYS["idempotency_key"])
    if ("header" in key) == ("body" in key):
        raise ctx.error(
            knode, where, "name exactly one place for the key: header (Idempotency-Key) or body (a dotted field)"
        )
    if "header" in key:
        out["idempotency_header"] = header = ctx.string(key["header"][1], f"{where}.header")
        if not HEADER.match(header):
            raise ctx.error(key["header"][1], f"{where}.header", f"{header!r} is not a valid header name")
    else:
        out["idempotency_body"] = body = ctx.string(key["body"][1], f"{where}.body")
        if not DOTTED.match(body) or any(p.isdecimal() for p in body.split(".")):
            raise ctx.error(key["body"][1], f"{where}.body", f"{body!r} is not a dotted field path like 'input.id'")
        if graphql and "." not in body:
            raise ctx.error(
                key["body"][1],
                f"{where}.body",
                "for a GraphQL operation, name a field inside an argument, like 'input.id'",
            )
    if "ttl" in key:
        out["idempotency_ttl"] = ttl = ctx.duration(key["ttl"][1], f"{where}.ttl")
        if ttl <= 0:
            raise ctx.error(key["ttl"][1], f"{where}.ttl", "must be longer than 0s")
    if "format" in key:
        out["idempotency_format"] = fmt = ctx.string(key["format"][1], f"{where}.format")
        if fmt not in ("receipt", "uuid4"):
            raise ctx.error(key["format"][1], f"{where}.format", f"{fmt!r} is not one of receipt, uuid4")
    return out


def load_fingerprint(
    ctx: Ctx, f: str, node: yaml.Node | None, path: PathTemplate | None, declared: Declared | None = None
) -> FingerprintSpec:
    """
    `fingerprint:`: the allowlist of path parameters, body fields, query parameters and headers;
    never secrets (a declared credential among them is refused; a path parameter that carries one
    enters as a keyed hash of it). Each bad item is reported and the next one read; on a `path`
    that did not parse (None), the path parameters named are not checked.
    """
    declared = declared or Declared()
    params = path.params if path is not None else ()
    if node is None:
        return FingerprintSpec(path=params, body=None)
    fp = ctx.mapping(node, f"{f}.fingerprint", KEYS["fingerprint"])
    path_params = _fingerprint_path(ctx, f, fp, path) if "path" in fp else list(params)
    body = _fingerprint_body(ctx, f, fp, declared) if "body" in fp else None
    return FingerprintSpec(
        path=tuple(path_params),
        body=None if body is None else tuple(body),
        query=tuple(_fingerprint_query(ctx, f, fp, declared)),
        headers=tuple(_fingerprint_headers(ctx, f, fp)),
    )


def _items(ctx: Ctx, f: str, fp: dict[str, Entry], key: str) -> list[tuple[yaml.Node, str]]:
    """The names a `fingerprint:` list gives (none if it is absent or not a list of names: reported)."""
    return (ctx.attempt(ctx.strings, fp[key][1], f"{f}.fingerprint.{key}") or []) if key in fp else []


def _bad(ctx: Ctx, f: str, item: yaml.Node, key: str, message: str) -> None:
    ctx.report(ctx.error(item, f"{f}.fingerprint.{key}", message))


def _fingerprint_path(ctx: Ctx, f: str, fp: dict[str, Entry], path: PathTemplate | None) -> list[str]:
    """`fingerprint.path`: parameters of the operation's path (unchecked when the path did not parse)."""
    params = path.params if path is not None else ()
    path_params = []
    for item, p in _items(ctx, f, fp, "path"):
        if path is not None and p not in path.params:
            _bad(
                ctx,
                f,
                item,
                "path",
                f"{p!r} is not a parameter of {path.template!r}"
                + (" in each of its paths" if path.alternatives else "")
                + f" (it has: {', '.join(params) or 'none'})",
            )
        else:
            path_params.append(p)
    return path_params


def _fingerprint_body(ctx: Ctx, f: str, fp: dict[str, Entry], declared: Declared) -> list[str]:
    """`fingerprint.body`: dotted field paths, none of them a credential."""
    body = []
    for item, b in _items(ctx, f, fp, "body"):
        if not DOTTED.match(b):
            _bad(ctx, f, item, "body", f"{b!r} is not a dotted field path like 'article.title'")
        elif any(is_secret_name(part) for part in b.split(".")):
            _bad(ctx, f, item, "body", f"{b!r} looks like a credential; secrets never enter a fingerprint")
        elif b in declared.body:
            _bad(
                ctx,
                f,
                item,
                "body",
                f"{b!r} is declared a credential (credentials.body); secrets never enter a fingerprint",
            )
        else:
            body.append(b)
    return body


def _fingerprint_query(ctx: Ctx, f: str, fp: dict[str, Entry], declared: Declared) -> list[str]:
    """`fingerprint.query`: query parameter names, none of them a credential."""
    query = []
    for item, q in _items(ctx, f, fp, "query"):
        if is_secret_name(q):
            _bad(ctx, f, item, "query", f"{q!r} looks like a credential; secrets never enter a fingerprint")
        elif q in declared.query:
            _bad(
                ctx,
                f,
                item,
                "query",
                f"{q!r} is declared a credential (credentials.query); it never enters a fingerprint",
            )
        else:
            query.append(q)
    return query


def _fingerprint_headers(ctx: Ctx, f: str, fp: dict[str, Entry]) -> list[str]:
    """`fingerprint.headers`: header names (lower-cased), none of them carrying credentials."""
    headers = []
    for item, h in _items(ctx, f, fp, "headers"):
        low = h.lower()
        if not HEADER.match(h):
            _bad(ctx, f, item, "headers", f"{h!r} is not a valid header name")
        elif is_secret_header(low, ctx.credential_headers):
            _bad(ctx, f, item, "headers", f"{h!r} carries credentials; secrets never enter a fingerprint")
        else:
            headers.append(low)
    return headers
