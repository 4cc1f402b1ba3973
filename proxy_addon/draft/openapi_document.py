"""
An OpenAPI 3.0/3.1 or Swagger 2.0 document (JSON or YAML), read one way for drafting rules: its
hosts, base path, security schemes and operations, each with its parameters, request body and
answers, local `$ref`s followed where they are used.

    doc = read_document(Path("resend.yaml"))
    for op in doc.operations: op.method, op.path, op.pointer, op.body_schema ...

`$ref`s are followed lazily (`Refs.resolve`), one node at a time, and only local ones
(`#/components/schemas/X`, JSON Pointer, RFC 6901): a document that points into another file
or a URL is refused, naming where. Nothing is fetched, and a recursive schema (a tree of
comments) costs nothing until the drafter walks into it, with a bound on how deep.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import yaml

from proxy_addon.errors import DraftError

MAX_DOCUMENT_BYTES = 64 * 1024 * 1024  # Slack's Web API is 1 MB, GitHub's 12 MB
MAX_REF_HOPS = 64  # a $ref to a $ref ... (a loop of them is refused before this)
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
MUTATING = ("POST", "PUT", "PATCH", "DELETE")


def pointer(*parts: str) -> str:
    """A JSON Pointer (RFC 6901) as a URI fragment: pointer("paths", "/emails", "post") is `#/paths/~1emails/post`."""
    return "#" + "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


class Refs:
    """The document's local `$ref`s, followed on demand."""

    def __init__(self, root: Any, source: str):
        self.root = root
        self.source = source

    def resolve(self, node: Any, where: str) -> Any:
        """`node`, or what its `$ref` (and theirs) point at. DraftError for a remote, broken or looping ref."""
        seen: list[str] = []
        while isinstance(node, Mapping) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if ref in seen:
                raise DraftError(f"$ref {ref!r} leads back to itself", source=self.source, where=where)
            if len(seen) >= MAX_REF_HOPS:
                raise DraftError(f"more than {MAX_REF_HOPS} $refs in a row", source=self.source, where=where)
            seen.append(ref)
            node = self._target(ref, where)
            where = ref
        return node

    def _target(self, ref: str, where: str) -> Any:
        if not ref.startswith("#"):
            raise DraftError(
                f"$ref {ref!r} is not local: only refs into this document (#/...) are followed; "
                "bundle the document first (for example with `redocly bundle`)",
                source=self.source,
                where=where,
            )
        node = self.root
        for raw in ref[1:].split("/")[1:] if ref != "#" else []:
            part = unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdecimal() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise DraftError(f"$ref {ref!r} points at nothing in the document", source=self.source, where=where)
        return node


@dataclass(frozen=True)
class Param:
    """A parameter of an operation: its name, where it goes (path, query, header, cookie, form) and its schema."""

    name: str
    where: str
    required: bool
    schema: Mapping[str, Any]


@dataclass(frozen=True)
class Answer:
    """A documented answer: its status (`200`, `4XX`, `default`), its JSON schema if any, its header names."""

    status: str
    schema: Mapping[str, Any] | None
    headers: tuple[str, ...]
    pointer: str


@dataclass(frozen=True)
class ApiOperation:
    method: str  # upper case
    path: str  # the document's path, without the base path
    pointer: str  # where it is: #/paths/~1emails/post
    operation_id: str | None
    summary: str | None
    params: tuple[Param, ...]
    body_schema: Mapping[str, Any] | None  # the request body's schema (a form's fields as an object)
    body_type: str | None  # its media type: application/json, application/x-www-form-urlencoded, ...
    body_pointer: str
    answers: tuple[Answer, ...]
    security: tuple[str, ...]  # the names of the security schemes it may use
    consumes: tuple[str, ...] = ()


@dataclass
class ApiDocument:
    source: str
    version: str  # "2.0" or the openapi version
    title: str
    hosts: list[str]
    base_path: str  # "/api" (Swagger's basePath, or the first server's path), "" for none
    schemes: dict[str, Mapping[str, Any]]  # security schemes by name
    operations: list[ApiOperation]
    refs: Refs
    notes: list[str] = field(default_factory=list)  # what the reader could not take as it is, with where


def read_document(path: Path) -> ApiDocument:
    """Read an OpenAPI or Swagger document from a file (DraftError naming the file when it is none)."""
    source = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise DraftError(f"{size} bytes: larger than {MAX_DOCUMENT_BYTES} bytes", source=source)
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise DraftError(e.strerror or str(e), source=source) from None
    except UnicodeDecodeError as e:
        raise DraftError(f"not UTF-8 text (byte {e.start})", source=source) from None
    return parse_document(text, source)


def parse_document(text: str, source: str) -> ApiDocument:
    """The document in `text` (JSON or YAML)."""
    try:
        root = json.loads(text) if text.lstrip().startswith("{") else yaml.load(text, Loader=_Loader)
    except (ValueError, yaml.YAMLError) as e:
        raise DraftError(f"neither JSON nor YAML: {str(e).splitlines()[0]}", source=source) from None
    except RecursionError:
        raise DraftError("nested too deeply", source=source) from None
    if not isinstance(root, Mapping):
        raise DraftError("not an OpenAPI document: the top level is not a mapping", source=source)
    version = str(root.get("openapi") or root.get("swagger") or "")
    if not (version.startswith("3.") or version == "2.0"):
        raise DraftError(
            "not an OpenAPI 3.x or Swagger 2.0 document (no `openapi: 3...` or `swagger: '2.0'`)", source=source
        )
    if not isinstance(root.get("paths"), Mapping):
        raise DraftError("the document has no paths", source=source, where="#/paths")
    refs = Refs(root, source)
    info = _mapping(root.get("info"))
    notes: list[str] = []
    if version == "2.0":
        hosts, base = _swagger_hosts(root)
        schemes = _mapping(root.get("securityDefinitions"))
    else:
        hosts, base = _servers(root, notes)
        schemes = _mapping(_mapping(root.get("components")).get("securitySchemes"))
    schemes = {
        name: _mapping(refs.resolve(s, pointer("components", "securitySchemes", name))) for name, s in schemes.items()
    }
    doc = ApiDocument(
        source=source,
        version=version,
        title=str(info.get("title") or ""),
        hosts=hosts,
        base_path=base,
        schemes=schemes,
        operations=[],
        refs=refs,
        notes=notes,
    )
    doc.operations = list(_operations(doc, root))
    return doc


class _Loader(yaml.SafeLoader):
    """YAML as JSON reads it: `200:` and `on:` are the strings an OpenAPI document means."""


def _plain_str(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    value = loader.construct_scalar(node)  # type: ignore[arg-type]
    return value


# Mapping keys like 200, 2XX, yes, on: strings (an answer's status, a property named `on`), not ints and booleans.
for _tag in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int"):
    _Loader.add_constructor(_tag, _plain_str)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", _plain_str)  # a date in an example stays text: JSON has no dates


def _mapping(value: Any) -> dict[str, Any]:
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else {}


def _swagger_hosts(root: Mapping[str, Any]) -> tuple[list[str], str]:
    host = root.get("host")
    base = str(root.get("basePath") or "").rstrip("/")
    return ([str(host).lower()] if host else []), base


def _servers(root: Mapping[str, Any], notes: list[str]) -> tuple[list[str], str]:
    """The hosts of `servers:` (their variables at their defaults) and the first one's path."""
    hosts: list[str] = []
    base: str | None = None
    servers = root.get("servers")
    for i, server in enumerate(servers if isinstance(servers, list) else []):
        if not isinstance(server, Mapping) or not isinstance(server.get("url"), str):
            continue
        url = server["url"]
        for name, var in _mapping(server.get("variables")).items():
            default = _mapping(var).get("default")
            if default is not None:
                url = url.replace("{" + name + "}", str(default))
        if "{" in url:
            notes.append(f"{pointer('servers', str(i), 'url')}: {url!r} has a variable with no default")
            continue
        parts = urlsplit(url if "//" in url else "https://placeholder.invalid" + url)
        path = parts.path.rstrip("/")
        if base is None:
            base = path
        elif path != base:
            notes.append(f"{pointer('servers', str(i), 'url')}: its path {path!r} differs from the first server's")
        if parts.hostname and parts.hostname != "placeholder.invalid":
            host = parts.hostname.lower() + (f":{parts.port}" if parts.port else "")
            if host not in hosts:
                hosts.append(host)
    return hosts, base or ""


def _operations(doc: ApiDocument, root: Mapping[str, Any]) -> Any:
    refs = doc.refs
    global_security = root.get("security")
    for path, item in _mapping(root["paths"]).items():
        where_item = pointer("paths", path)
        item = _mapping(refs.resolve(item, where_item))
        shared: list[Any] = item["parameters"] if isinstance(item.get("parameters"), list) else []
        for method in HTTP_METHODS:
            if not isinstance(item.get(method), Mapping):
                continue
            where = pointer("paths", path, method)
            op = item[method]
            own = op.get("parameters") if isinstance(op.get("parameters"), list) else []
            params, form = _params(refs, [*shared, *own], where)
            body_schema, body_type, body_pointer = _body(doc, refs, op, params, form, where)
            security = op.get("security", global_security)
            yield ApiOperation(
                method=method.upper(),
                path=path,
                pointer=where,
                operation_id=str(op["operationId"]) if op.get("operationId") else None,
                summary=str(op.get("summary") or op.get("description") or "").strip().split("\n")[0][:120] or None,
                params=tuple(p for p in params if p.where != "body"),
                body_schema=body_schema,
                body_type=body_type,
                body_pointer=body_pointer,
                answers=tuple(_answers(doc, refs, op, where)),
                security=tuple(name for req in security or [] if isinstance(req, Mapping) for name in req),
                consumes=tuple(op.get("consumes") or root.get("consumes") or ()),
            )


def _params(refs: Refs, raw: list[Any], where: str) -> tuple[list[Param], dict[str, Any]]:
    """The parameters (an operation's own override the path's of the same name and place), and Swagger's form fields."""
    found: dict[tuple[str, str], Param] = {}
    for i, p in enumerate(raw):
        p = _mapping(refs.resolve(p, f"{where}/parameters/{i}"))
        name, place = p.get("name"), p.get("in")
        if not isinstance(name, str) or not isinstance(place, str):
            continue
        given = p.get("schema")
        schema: Mapping[str, Any] = (
            given
            if isinstance(given, Mapping)
            else {k: v for k, v in p.items() if k in ("type", "format", "items", "enum", "maximum")}
        )
        place = "form" if place == "formData" else place
        found[(place, name)] = Param(name, place, bool(p.get("required")) or place == "path", schema)
    form = {
        "type": "object",
        "properties": {p.name: p.schema for p in found.values() if p.where == "form"},
        "required": [p.name for p in found.values() if p.where == "form" and p.required],
    }
    return list(found.values()), form


PREFERRED_BODIES = ("application/json", "application/x-www-form-urlencoded", "multipart/form-data")


def _body(
    doc: ApiDocument, refs: Refs, op: Mapping[str, Any], params: list[Param], form: dict[str, Any], where: str
) -> tuple[Mapping[str, Any] | None, str | None, str]:
    """The request body's schema and media type: OpenAPI 3's requestBody, Swagger's `in: body` or its form fields."""
    if doc.version == "2.0":
        for p in params:
            if p.where == "body":
                return p.schema, "application/json", where + "/parameters"
        if form["properties"]:
            consumes = [str(c) for c in op.get("consumes") or ()]
            form_type = next((c for c in consumes if c.startswith("multipart/")), "application/x-www-form-urlencoded")
            return form, form_type, where + "/parameters"
        return None, None, where
    body_where = where + "/requestBody"
    body = _mapping(refs.resolve(op.get("requestBody"), body_where))
    content = _mapping(body.get("content"))
    if not content:
        return None, None, body_where
    kind: str = (
        next((k for k in PREFERRED_BODIES if k in content), None)
        or next((k for k in content if k.endswith("json")), None)
        or next(iter(content))
    )
    media = _mapping(content[kind])
    schema = refs.resolve(media.get("schema"), f"{body_where}/content/{kind.replace('/', '~1')}/schema")
    return (schema if isinstance(schema, Mapping) else None), kind, body_where


def _answers(doc: ApiDocument, refs: Refs, op: Mapping[str, Any], where: str) -> Any:
    for status, answer in _mapping(op.get("responses")).items():
        at = f"{where}/responses/{status}"
        answer = _mapping(refs.resolve(answer, at))
        if doc.version == "2.0":
            schema = answer.get("schema")
        else:
            content = _mapping(answer.get("content"))
            kind = next((k for k in content if "json" in k), None)
            schema = _mapping(content[kind]).get("schema") if kind else None
        schema = refs.resolve(schema, at) if schema is not None else None
        headers = tuple(str(h) for h in _mapping(answer.get("headers")))
        yield Answer(str(status), schema if isinstance(schema, Mapping) else None, headers, at)
