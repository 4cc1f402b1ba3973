"""
What a JSON Schema (an OpenAPI request body or answer) says about fields, for a draft: an
object's properties and which are required (through `allOf`, `oneOf`, `anyOf` and local `$ref`s),
which of them identify a write, which look like secrets or blobs, which names the created object
(`id`), and where a list answer keeps its items.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy_addon.draft.openapi_document import Refs
from proxy_addon.wire.redaction import is_secret_name

MAX_DEPTH = 12  # allOf inside allOf ...: a recursive schema stops here

# Fields that usually tell two writes apart when the schema requires none: the words of a message,
# its recipients, a name, an amount. A draft takes those a body has, beside its required ones.
IDENTIFYING = (
    "to",
    "from",
    "cc",
    "bcc",
    "subject",
    "title",
    "name",
    "text",
    "html",
    "body",
    "content",
    "message",
    "email",
    "channel",
    "thread_ts",
    "amount",
    "currency",
    "description",
    "personalizations",
    "template_id",
)
BLOB_NAME = re.compile(r"(attachment|^files?$|^image$|^blob$|^raw$|^binary$|base64)", re.I)
ID_NAME = re.compile(r"^(id|uuid|[a-z]*_id|[a-z]*Id)$")


@dataclass(frozen=True)
class ObjectView:
    """An object schema's properties (name → schema, refs followed) and its required names, in the schema's order."""

    properties: dict[str, Mapping[str, Any]]
    required: tuple[str, ...]
    free_form: bool  # an object with no declared properties: any keys


def object_view(refs: Refs, schema: Any, where: str, depth: int = 0) -> ObjectView:
    """The object a schema describes; empty when it describes none (a string, a list, nothing)."""
    schema = refs.resolve(schema, where)
    if not isinstance(schema, Mapping) or depth > MAX_DEPTH:
        return ObjectView({}, (), False)
    props: dict[str, Mapping[str, Any]] = {}
    required: list[str] = [str(r) for r in schema.get("required") or () if isinstance(r, str)]
    for name, sub in (schema.get("properties") or {}).items():
        resolved = refs.resolve(sub, f"{where}/properties/{name}")
        props[str(name)] = resolved if isinstance(resolved, Mapping) else {}
    for i, part in enumerate(schema.get("allOf") or ()):
        view = object_view(refs, part, f"{where}/allOf/{i}", depth + 1)
        props.update({k: v for k, v in view.properties.items() if k not in props})
        required += [r for r in view.required if r not in required]
    alternatives = [
        object_view(refs, part, f"{where}/{key}/{i}", depth + 1)
        for key in ("oneOf", "anyOf")
        for i, part in enumerate(schema.get(key) or ())
    ]
    if alternatives:  # a field any alternative has; required only when every one requires it
        for view in alternatives:
            props.update({k: v for k, v in view.properties.items() if k not in props})
        required += [
            r for r in alternatives[0].required if all(r in v.required for v in alternatives) and r not in required
        ]
    free = not props and _type(schema) in ("object", None) and not alternatives
    return ObjectView(props, tuple(required), free)


def _type(schema: Mapping[str, Any]) -> str | None:
    t = schema.get("type")
    if isinstance(t, list):  # 3.1: ["string", "null"]
        t = next((x for x in t if x != "null"), None)
    return t if isinstance(t, str) else None


def is_blob(refs: Refs, name: str, schema: Mapping[str, Any], where: str) -> bool:
    """A file's bytes, base64 text or a free-form object: no field to tell writes apart by, and maybe a secret."""
    if BLOB_NAME.search(name):
        return True
    if schema.get("format") in ("binary", "byte", "base64") or "contentEncoding" in schema:
        return True
    t = _type(schema)
    if t == "object" or (
        t is None
        and "properties" not in schema
        and "allOf" not in schema
        and "oneOf" not in schema
        and "anyOf" not in schema
        and "items" not in schema
        and "enum" not in schema
        and schema
    ):
        return object_view(refs, schema, where).free_form
    return False


@dataclass(frozen=True)
class BodyFields:
    """The fingerprint's body fields a draft proposes, and what it left out, by reason."""

    chosen: tuple[str, ...]
    secrets: tuple[str, ...]
    blobs: tuple[str, ...]
    others: tuple[str, ...]  # neither required nor identifying: the user decides
    required: tuple[str, ...]


def body_fields(refs: Refs, schema: Any, where: str) -> BodyFields:
    """Required properties and identifying ones (IDENTIFYING), never secrets-looking or blob properties."""
    view = object_view(refs, schema, where)
    chosen: list[str] = []
    secrets: list[str] = []
    blobs: list[str] = []
    others: list[str] = []
    for name, sub in view.properties.items():
        if is_secret_name(name):
            secrets.append(name)
        elif is_blob(refs, name, sub, f"{where}/properties/{name}"):
            blobs.append(name)
        elif name in view.required or name in IDENTIFYING:
            chosen.append(name)
        else:
            others.append(name)
    return BodyFields(tuple(chosen), tuple(secrets), tuple(blobs), tuple(others), view.required)


def id_field(refs: Refs, schema: Any, where: str) -> str | None:
    """The answer's property naming the created object: `id`, else one `*_id`, else `data.id` (a wrapped object)."""
    view = object_view(refs, schema, where)
    if "id" in view.properties:
        return "id"
    ids = [n for n in view.properties if ID_NAME.match(n) and not is_secret_name(n)]
    if len(ids) == 1:
        return ids[0]
    for wrapper in ("data", "result", "object"):
        if wrapper in view.properties:
            inner = object_view(refs, view.properties[wrapper], f"{where}/properties/{wrapper}")
            if "id" in inner.properties:
                return f"{wrapper}.id"
    return None


def list_items(refs: Refs, schema: Any, where: str) -> tuple[str | None, Mapping[str, Any] | None]:
    """
    Where a list answer keeps its items (`data`: None for a top-level array) and the items'
    schema; (None, None) when the answer is no list.
    """
    schema = refs.resolve(schema, where)
    if not isinstance(schema, Mapping):
        return None, None
    if _type(schema) == "array":
        items = refs.resolve(schema.get("items"), f"{where}/items")
        return None, items if isinstance(items, Mapping) else {}
    view = object_view(refs, schema, where)
    arrays = [(n, s) for n, s in view.properties.items() if _type(s) == "array"]
    if not arrays:
        return None, None
    name, sub = next(((n, s) for n, s in arrays if n in ("data", "items", "results")), arrays[0])
    items = refs.resolve(sub.get("items"), f"{where}/properties/{name}/items")
    return name, items if isinstance(items, Mapping) else {}


def scalar_fields(refs: Refs, schema: Any, where: str) -> set[str]:
    """The properties of an object schema whose values are text, numbers or lists of them (what `find` can compare)."""
    view = object_view(refs, schema, where)
    out = set()
    for name, sub in view.properties.items():
        t = _type(sub)
        if t in ("string", "integer", "number", "boolean") or (
            t is None
            and any(_type(refs.resolve(s, where)) == "string" for s in sub.get("oneOf") or sub.get("anyOf") or ())
        ):
            out.add(name)
    return out


def boolean_field(refs: Refs, schema: Any, where: str, name: str) -> bool:
    """Whether an object schema has a boolean property `name` (Slack's `ok`)."""
    view = object_view(refs, schema, where)
    sub = view.properties.get(name)
    return sub is not None and (
        _type(sub) == "boolean" or (isinstance(sub.get("enum"), list) and all(isinstance(v, bool) for v in sub["enum"]))
    )
