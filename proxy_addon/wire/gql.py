"""
GraphQL requests, read with graphql-core: which mutation a POST runs, with which arguments.

    call = mutation_fields(body)        # {"issueCreate": {"input": {...}}} or None
    read_is_query(text)                 # False when a document holds a mutation

A rule recognises a GraphQL operation by the root field of the mutation the request
executes (`issueCreate`), never by `operationName`, which the client chooses (Linear's
SDK sends `createIssue`). Arguments are resolved with the request's variables, so
`issueCreate(input: $input)` and `issueCreate(input: {title: "x"})` read the same.

A body sent to a GraphQL endpoint is read strictly (json_body.read_strict): one that is not
UTF-8 JSON, has a key twice in one object, or whose top level has two keys that differ only
by case or spells `query`, `variables`, `operationName` or `extensions` in another case (Go
servers such as gqlgen match these regardless of case) is `NotStrict`, and the proxy
refuses it: `read_mutation(body)`. A float literal is a JsonNumber, as in JSON variables.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

from graphql import GraphQLError, parse, print_ast
from graphql.language import (
    DocumentNode,
    FieldNode,
    FloatValueNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    InlineFragmentNode,
    ListValueNode,
    NameNode,
    ObjectFieldNode,
    ObjectValueNode,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    StringValueNode,
    ValueNode,
    VariableNode,
)
from graphql.pyutils import Undefined
from graphql.utilities import value_from_ast_untyped

from proxy_addon.wire.json_body import JsonNumber, NotStrict, case_twice, misspelled, read_strict

MAX_QUERY = 256 * 1024  # a larger document is not read as GraphQL (it is fingerprinted by its hash)
REQUEST_KEYS = frozenset({"query", "variables", "operationName", "extensions"})  # GraphQL over HTTP
_WHAT = "the GraphQL request body"


def request_of(body: bytes) -> tuple[str, dict[str, Any], str | None] | None:
    """(query, variables, operationName) of a GraphQL-over-HTTP POST body, or None (NotStrict too)."""
    request = _request(body)
    return None if isinstance(request, NotStrict) else request


def _request(body: bytes) -> tuple[str, dict[str, Any], str | None] | NotStrict | None:
    """request_of, or why the body is refused (module docstring)."""
    doc = read_strict(body, _WHAT, fold=False)  # variables are maps: their keys are read exactly, everywhere
    if isinstance(doc, NotStrict):
        return doc
    problem = case_twice(doc, _WHAT) or misspelled(doc, REQUEST_KEYS, _WHAT)
    if problem is not None:
        return problem
    if not isinstance(doc, dict) or not isinstance(doc.get("query"), str) or len(doc["query"]) > MAX_QUERY:
        return None
    variables = doc.get("variables") or {}
    name = doc.get("operationName")
    if not isinstance(variables, dict) or (name is not None and not isinstance(name, str)):
        return None
    return doc["query"], variables, name


@functools.lru_cache(maxsize=64)  # one request's body is read by matching, fingerprinting and the id
def _document(query: str) -> DocumentNode | None:
    try:
        return parse(query, no_location=True)
    except (GraphQLError, RecursionError):
        return None


def _executed(doc: DocumentNode, name: str | None) -> OperationDefinitionNode | None:
    """The operation a server executes: the one named `operationName`, or the only one."""
    ops = [d for d in doc.definitions if isinstance(d, OperationDefinitionNode)]
    if name:
        return next((o for o in ops if o.name and o.name.value == name), None)
    return ops[0] if len(ops) == 1 else None


def _mutation(body: bytes) -> tuple[DocumentNode, OperationDefinitionNode, dict[str, Any]] | NotStrict | None:
    """The document, the mutation it executes and the variables of a GraphQL POST body, or None (or NotStrict)."""
    request = _request(body)
    if request is None or isinstance(request, NotStrict):
        return request
    query, variables, name = request
    doc = _document(query)
    op = _executed(doc, name) if doc is not None else None
    if doc is None or op is None or op.operation is not OperationType.MUTATION:
        return None
    return doc, op, variables


def _fields_of(doc: DocumentNode, op: OperationDefinitionNode) -> list[FieldNode]:
    """The root fields an operation selects, through its fragments."""
    fragments = {d.name.value: d for d in doc.definitions if isinstance(d, FragmentDefinitionNode)}
    return _root_fields(op.selection_set, fragments)


def _root_fields(
    selection: SelectionSetNode, fragments: dict[str, FragmentDefinitionNode], depth: int = 0
) -> list[FieldNode]:
    out: list[FieldNode] = []
    for sel in selection.selections:
        if isinstance(sel, FieldNode):
            out.append(sel)
        elif depth < 8 and isinstance(sel, InlineFragmentNode):
            out += _root_fields(sel.selection_set, fragments, depth + 1)
        elif depth < 8 and isinstance(sel, FragmentSpreadNode) and sel.name.value in fragments:
            out += _root_fields(fragments[sel.name.value].selection_set, fragments, depth + 1)
    return out


def _plain(value: Any) -> Any:
    if value is Undefined:
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def mutation_fields(body: bytes) -> dict[str, dict[str, Any]] | None:
    """
    The root fields of the mutation a GraphQL POST body executes, each with its arguments
    (variables substituted), or None when the body is not a GraphQL mutation (or is refused).
    """
    fields = read_mutation(body)
    return None if isinstance(fields, NotStrict) else fields


def read_mutation(body: bytes) -> dict[str, dict[str, Any]] | NotStrict | None:
    """mutation_fields, or NotStrict: why the body must be refused (module docstring)."""
    mutation = _mutation(body)
    if mutation is None or isinstance(mutation, NotStrict):
        return mutation
    doc, op, variables = mutation
    fields: dict[str, dict[str, Any]] = {}
    for f in _fields_of(doc, op):
        args = {a.name.value: _plain(_untyped(a.value, variables)) for a in f.arguments or ()}
        fields.setdefault(f.name.value, args)
    return fields


def _untyped(node: ValueNode, variables: dict[str, Any]) -> Any:
    """value_from_ast_untyped, a float literal as a JsonNumber (`1e400` keeps its text, as in JSON)."""
    if isinstance(node, FloatValueNode):
        return JsonNumber(node.value)
    if isinstance(node, ListValueNode):
        return [_untyped(v, variables) for v in node.values]
    if isinstance(node, ObjectValueNode):
        return {f.name.value: _untyped(f.value, variables) for f in node.fields}
    return value_from_ast_untyped(node, variables)


def argument_variable(body: bytes, field_name: str, argument: str) -> str | None:
    """The name of the variable that carries `argument` of the mutation's root field `field_name`, if one does."""
    mutation = _mutation(body)
    for f in _fields_of(*mutation[:2]) if mutation and not isinstance(mutation, NotStrict) else ():
        if f.name.value == field_name:
            for a in f.arguments or ():
                if a.name.value == argument and isinstance(a.value, VariableNode):
                    return a.value.name.value
    return None


def _with(node: Any, **changes: Any) -> Any:
    """A copy of an AST node with some fields changed (graphql-core 3.3 nodes are frozen)."""
    try:
        return dataclasses.replace(node, **changes)
    except TypeError:  # graphql-core 3.2: plain classes listing their fields in `keys`
        return type(node)(**{**{k: getattr(node, k) for k in node.keys if k != "loc"}, **changes})


def _set_field(obj: ObjectValueNode, path: list[str], value: str) -> ObjectValueNode | None:
    """`obj` with `path` set to the string `value`, or None when a step is not an object."""
    fields = list(obj.fields)
    index = next((i for i, f in enumerate(fields) if f.name.value == path[0]), None)
    if len(path) == 1:
        new: Any = StringValueNode(value=value)
    else:
        inner = fields[index].value if index is not None else ObjectValueNode(fields=())
        if not isinstance(inner, ObjectValueNode):
            return None
        new = _set_field(inner, path[1:], value)
        if new is None:
            return None
    if index is None:
        fields.append(ObjectFieldNode(name=NameNode(value=path[0]), value=new))
    else:
        fields[index] = _with(fields[index], value=new)
    return _with(obj, fields=tuple(fields))


def with_inline_value(body: bytes, field_name: str, path: list[str], value: str) -> bytes | None:
    """
    The GraphQL body with `value` written at `path` inside an inline (literal) argument of the
    mutation's root field `field_name`, as in `issueCreate(input: {title: "x"})` → `input.id`.
    The document is printed anew (same meaning, other layout). None when there is no such
    inline object argument on a root field written directly in the operation.
    """
    mutation = _mutation(body)
    if mutation is None or isinstance(mutation, NotStrict) or len(path) < 2:
        return None
    doc, op, _ = mutation
    selections = list(op.selection_set.selections)
    for i, sel in enumerate(selections):
        if not isinstance(sel, FieldNode) or sel.name.value != field_name:
            continue
        args = list(sel.arguments or ())
        for j, arg in enumerate(args):
            if arg.name.value == path[0] and isinstance(arg.value, ObjectValueNode):
                obj = _set_field(arg.value, path[1:], value)
                if obj is None:
                    return None
                args[j] = _with(arg, value=obj)
                selections[i] = _with(sel, arguments=tuple(args))
                new_op = _with(op, selection_set=_with(op.selection_set, selections=tuple(selections)))
                definitions = tuple(new_op if d is op else d for d in doc.definitions)
                out = json.loads(body)
                out["query"] = print_ast(_with(doc, definitions=definitions))
                return json.dumps(out, ensure_ascii=False).encode()
        return None
    return None


def read_is_query(query: str) -> str | None:
    """Why a GraphQL document may not be sent as a read (it does not parse, or holds a mutation), or None."""
    doc = _document(query)
    if doc is None:
        return "the GraphQL document does not parse"
    for d in doc.definitions:
        if isinstance(d, OperationDefinitionNode) and d.operation is not OperationType.QUERY:
            return f"the GraphQL document holds a {d.operation.value}; a read holds queries only"
    return None
