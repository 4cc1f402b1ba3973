"""
Loading one operation of a rules file: what it matches, what identifies its intent, how its
answers are classified and how an unknown outcome is resolved.

    articles.create:
      match: {method: POST, path: /api/articles}
      fingerprint: {body: [article.title, article.body_markdown]}
      external_id: id
"""

from __future__ import annotations

from typing import Any, cast

import yaml

from proxy_addon.redaction import is_secret_header, is_secret_name
from proxy_addon.rules.load_classify import load_classify
from proxy_addon.rules.load_reconcile import load_reconcile
from proxy_addon.rules.model import (
    AFTER_SUCCESS,
    ALREADY_EXISTS,
    IDENT,
    KEYS,
    METHOD_OVERRIDE,
    METHODS,
    AfterSuccess,
    FingerprintSpec,
    Operation,
    PathTemplate,
    parse_path_template,
)
from proxy_addon.rules.nodes import DOTTED, HEADER, Ctx, Entry


def load_operation(
    ctx: Ctx,
    api: str,
    name: str,
    node: yaml.Node,
    credential_headers: tuple[str, ...],
    credentials_env: str | None = None,
) -> Operation:
    """One entry of `operations:`, its parts in the order their problems are reported."""
    f = f"operations.{name}"
    op = ctx.mapping(node, f, KEYS["operation"], ("match",))
    description = ctx.string(op["description"][1], f"{f}.description") if "description" in op else None
    method, path, graphql, method_override = _match(ctx, f, op["match"][1])
    fp = load_fingerprint(ctx, f, op["fingerprint"][1] if "fingerprint" in op else None, path, credential_headers)
    external_id, external_id_header = _external_id(ctx, f, op)
    after_success = _after_success(ctx, f, op)
    classify, classify_rules = load_classify(ctx, op["classify"][1], f"{f}.classify") if "classify" in op else ((), ())
    idempotency = _idempotency_key(ctx, f, op, graphql)
    idempotent = bool(idempotency["idempotency_header"] or idempotency["idempotency_body"])
    reconcile = (
        load_reconcile(ctx, f, op["reconcile"][1], fp, external_id, idempotent=idempotent)
        if "reconcile" in op
        else None
    )
    for state in (*(r.state for r in classify_rules), *(v for _, v in classify)):
        if state == ALREADY_EXISTS and reconcile is None:
            problem = "an already_exists answer needs a reconcile read to decide; add reconcile: to this operation"
            raise ctx.error(op["classify"][1], f"{f}.classify", problem)
    approve = ctx.boolean(op["approve"][1], f"{f}.approve") if "approve" in op else False
    return Operation(
        api=api,
        name=name,
        method=method,
        path=path,
        fingerprint=fp,
        credential_headers=credential_headers,
        external_id=external_id,
        after_success=after_success,
        classify=classify,
        source=ctx.source,
        reconcile=reconcile,
        credentials_env=credentials_env,
        approve=approve,
        graphql=graphql,
        classify_rules=classify_rules,
        external_id_header=external_id_header,
        description=description,
        method_override=method_override,
        **idempotency,
    )


def method_override(ctx: Ctx, node: yaml.Node, field_: str) -> str:
    """`method_override:` honour (match the method X-HTTP-Method-Override names) or refuse (answer 400)."""
    value = ctx.string(node, field_)
    if value not in METHOD_OVERRIDE:
        raise ctx.error(node, field_, f"{value!r} is not one of {', '.join(METHOD_OVERRIDE)}")
    return value


def _match(ctx: Ctx, f: str, node: yaml.Node) -> tuple[str, PathTemplate, str | None, str]:
    """`match:`: the method, the path template (case-sensitive unless `case_insensitive: true`), for a
    GraphQL mutation its root field, and what a method override header gets (the file's unless it says)."""
    m = ctx.mapping(node, f"{f}.match", KEYS["match"], ("method", "path"))
    method_node = m["method"][1]
    method = ctx.string(method_node, f"{f}.match.method").upper()
    if method not in METHODS:
        raise ctx.error(method_node, f"{f}.match.method", f"{method!r} is not one of {', '.join(METHODS)}")
    path_node = m["path"][1]
    fold = ctx.boolean(m["case_insensitive"][1], f"{f}.match.case_insensitive") if "case_insensitive" in m else False
    try:
        path = parse_path_template(ctx.string(path_node, f"{f}.match.path"), case_insensitive=fold)
    except ValueError as e:
        raise ctx.error(path_node, f"{f}.match.path", str(e)) from None

    graphql = None
    if "graphql" in m:
        graphql = ctx.string(m["graphql"][1], f"{f}.match.graphql")
        if not IDENT.match(graphql):
            raise ctx.error(
                m["graphql"][1], f"{f}.match.graphql", f"{graphql!r} is not a GraphQL field name like issueCreate"
            )
        if method != "POST":
            raise ctx.error(m["graphql"][1], f"{f}.match.graphql", "GraphQL mutations are POSTs; use method: POST")
    override = (
        method_override(ctx, m["method_override"][1], f"{f}.match.method_override")
        if "method_override" in m
        else ctx.method_override
    )
    return method, path, graphql, override


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
    ctx: Ctx, f: str, node: yaml.Node | None, path: PathTemplate, credential_headers: tuple[str, ...]
) -> FingerprintSpec:
    """`fingerprint:`: the allowlist of path parameters, body fields, query parameters and headers; never secrets."""
    if node is None:
        return FingerprintSpec(path=path.params, body=None)
    fp = ctx.mapping(node, f"{f}.fingerprint", KEYS["fingerprint"])
    path_params = list(path.params)
    if "path" in fp:
        path_params = []
        for item, p in ctx.strings(fp["path"][1], f"{f}.fingerprint.path"):
            if p not in path.params:
                known = ", ".join(path.params) or "none"
                raise ctx.error(
                    item, f"{f}.fingerprint.path", f"{p!r} is not a parameter of {path.template!r} (it has: {known})"
                )
            path_params.append(p)
    body = None
    if "body" in fp:
        body = []
        for item, b in ctx.strings(fp["body"][1], f"{f}.fingerprint.body"):
            if not DOTTED.match(b):
                raise ctx.error(item, f"{f}.fingerprint.body", f"{b!r} is not a dotted field path like 'article.title'")
            if any(is_secret_name(part) for part in b.split(".")):
                raise ctx.error(
                    item, f"{f}.fingerprint.body", f"{b!r} looks like a credential; secrets never enter a fingerprint"
                )
            body.append(b)
    query = []
    for item, q in ctx.strings(fp["query"][1], f"{f}.fingerprint.query") if "query" in fp else ():
        if is_secret_name(q):
            raise ctx.error(
                item, f"{f}.fingerprint.query", f"{q!r} looks like a credential; secrets never enter a fingerprint"
            )
        query.append(q)
    headers = []
    for item, h in ctx.strings(fp["headers"][1], f"{f}.fingerprint.headers") if "headers" in fp else ():
        low = h.lower()
        if not HEADER.match(h):
            raise ctx.error(item, f"{f}.fingerprint.headers", f"{h!r} is not a valid header name")
        if is_secret_header(low, credential_headers):
            raise ctx.error(
                item, f"{f}.fingerprint.headers", f"{h!r} carries credentials; secrets never enter a fingerprint"
            )
        headers.append(low)
    return FingerprintSpec(
        path=tuple(path_params),
        body=None if body is None else tuple(body),
        query=tuple(query),
        headers=tuple(headers),
    )
