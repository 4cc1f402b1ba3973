"""
Proxy-chosen identities (`idempotency_key:` in a rule): a key the API deduplicates by,
sent in a header, or an id written into the JSON body (Linear's `input.id`).

    given, ok = body_key(op, body, graphql_args)   # the agent's own value, whether we can write ours
    body = with_body_key(op, body, key)            # the body with our key in place

The fingerprint is computed from the agent's request before any of this: its retries carry
no key of ours, and must still be recognised.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from proxy_addon.rules import Operation
from proxy_addon.wire import gql
from proxy_addon.wire.json_body import read_json
from proxy_addon.wire.jsonpath import NOT_JSON, dig, parse_json


def _target(op: Operation, doc: Any, body: bytes) -> tuple[dict | None, list[str]]:
    """The object the key's path starts from (the JSON body, or a GraphQL variable) and the rest of the path."""
    path = (op.idempotency_body or "").split(".")
    if op.graphql is None:
        return (doc if isinstance(doc, dict) else None), path
    variable = gql.argument_variable(body, op.graphql, path[0])
    if variable is None or not isinstance(doc, dict):
        return None, path  # an inline argument (or none): with_body_key writes into the document
    if doc.get("variables") is None:
        doc["variables"] = {}
    variables = doc["variables"]
    if not isinstance(variables, dict):
        return None, path
    if variables.get(variable) is None:
        variables[variable] = {}
    return (variables if isinstance(variables[variable], dict) else None), [variable, *path[1:]]


def body_key(
    op: Operation,
    body: bytes,
    graphql_args: dict[str, Any] | None = None,
    *,
    parse: Callable[..., Any] = read_json,
) -> tuple[str | None, bool]:
    """
    The agent's own value at the key's path (a new attempt's key), and whether we could write one
    there. `parse`: how the body is read as JSON (the request's one parse: fingerprint.parse_once);
    the document is only read here, never changed.
    """
    if op.idempotency_body is None:
        return None, False
    if op.graphql is not None:
        given = dig(graphql_args or {}, op.idempotency_body)
        if given is None:
            return None, with_body_key(op, body, "probe") is not None
    else:
        doc = parse(body)
        if doc is NOT_JSON:
            return None, False
        given = dig(doc, op.idempotency_body)
        if given is None:
            return None, _room(doc, op.idempotency_body.split("."))
    return (given if isinstance(given, str) else json.dumps(given)), True


def _room(doc: Any, path: list[str]) -> bool:
    """Whether with_body_key can write at `path` in this JSON document (as it would, without writing)."""
    if not isinstance(doc, dict):
        return False
    node = doc
    for part in path[:-1]:
        child = node.get(part)
        if child is None:
            return True  # with_body_key makes the objects from here on
        if not isinstance(child, dict):
            return False
        node = child
    return True


def with_body_key(op: Operation, body: bytes, key: str) -> bytes | None:
    """The JSON body with `key` at the rule's path, or None when the body has no place for it."""
    doc = parse_json(body)
    if doc is NOT_JSON:
        return None
    node, path = _target(op, doc, body)
    if node is None and op.graphql is not None:  # an inline argument: write it into the document
        return gql.with_inline_value(body, op.graphql, (op.idempotency_body or "").split("."), key)
    if node is None:
        return None
    for part in path[:-1]:
        if node.get(part) is None:
            node[part] = {}
        if not isinstance(node[part], dict):
            return None
        node = node[part]
    node[path[-1]] = key
    return json.dumps(doc, ensure_ascii=False).encode()
