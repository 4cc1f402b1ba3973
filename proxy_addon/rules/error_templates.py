"""
An error template: the error envelope of an API that none of the named ones fits (`errors:` as a
mapping), its syntax, and loading it strictly.

    errors:
      template: {status: error, error: {code: "{code}", text: "{message}", http: "{status}"}}
      key: details.receipt_proxy     # where the proxy's own answer goes; default receipt_proxy, at the top

The template is the envelope's JSON object, written in YAML. A string in it may hold the
placeholders ERROR_FIELDS names: `{code}` (the proxy's error code), `{message}` (the text an SDK
shows: the explanation and the receipt id), `{status}` (the HTTP status, a number),
`{operation_id}` and `{state}` (the receipt's; null when there is none). A string that is exactly
one placeholder takes its value's own type (`"{status}"` is 409, not "409"); anywhere else a value
is written as text (nothing for a missing one). `{{` and `}}` are a literal brace; keys are taken
as written. Anything else in braces is an error at load, naming the file, the line and the field.

The loaded template is kept in Operation.errors as canonical JSON text (`canonical`), so that the
Operation stays frozen and hashable and a flow's metadata stays plain data; outcome/error_envelopes.py
reads it back (`parsed`) and renders it.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

import yaml

from proxy_addon.rules.model import ERROR_ENVELOPES, KEYS
from proxy_addon.rules.nodes import DOTTED, Ctx, node_kind, scalar_value

ERROR_FIELDS = ("code", "message", "status", "operation_id", "state")  # the placeholders a template may use
DEFAULT_KEY = ("receipt_proxy",)  # where the proxy's own answer goes unless `key:` says
MAX_DEPTH = 16  # how deep a template nests: an error envelope is shallow

_PIECE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
Pieces = tuple[tuple[str, bool], ...]  # (literal text, False) and (placeholder name, True), in order


@functools.lru_cache(maxsize=256)
def pieces(text: str) -> Pieces:
    """A template string's literal text and placeholders, in order. ValueError: a lone brace, or
    braces around anything but a name in ERROR_FIELDS."""
    out: list[tuple[str, bool]] = []
    literal = ""
    pos = 0
    for m in _PIECE.finditer(text):
        literal += text[pos : m.start()]
        pos = m.end()
        token = m.group(0)
        if token in ("{{", "}}"):
            literal += token[0]
        elif token in ("{", "}"):
            raise ValueError(f"a lone {token!r} in {text!r}: write {token * 2!r} for a brace")
        elif m.group(1) not in ERROR_FIELDS:
            known = ", ".join(f"{{{name}}}" for name in ERROR_FIELDS)
            raise ValueError(f"{token} is not a placeholder of an error template; it may use: {known}")
        else:
            if literal:
                out.append((literal, False))
            literal = ""
            out.append((m.group(1), True))
    literal += text[pos:]
    if literal:
        out.append((literal, False))
    return tuple(out)


def canonical(template: dict[str, Any], key: tuple[str, ...]) -> str:
    """The text Operation.errors keeps for a template: compact JSON, the template's own key order."""
    return json.dumps({"key": list(key), "template": template}, ensure_ascii=False, separators=(",", ":"))


def is_template(errors: str) -> bool:
    """Whether an Operation's `errors` is a template's canonical text (else an ERROR_ENVELOPES name)."""
    return errors.startswith("{")


@functools.lru_cache(maxsize=64)
def parsed(errors: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A template's canonical text read back: the template (never to be changed in place) and its key."""
    doc = json.loads(errors)
    return doc["template"], tuple(doc["key"])


def load_errors(ctx: Ctx, node: yaml.Node) -> str:
    """`errors:` a name in ERROR_ENVELOPES, or a template (a mapping) in its canonical text."""
    if isinstance(node, yaml.MappingNode):
        return _load_template(ctx, node)
    choice = f"one of {', '.join(ERROR_ENVELOPES)}, or a template ({{template: ..., key: ...}})"
    if not isinstance(node, yaml.ScalarNode) or node.tag != "tag:yaml.org,2002:str" or not node.value:
        raise ctx.error(node, "errors", f"expected {choice}, got {node_kind(node)}")
    if node.value not in ERROR_ENVELOPES:
        raise ctx.error(node, "errors", f"{node.value!r} is not {choice}")
    return node.value


def _load_template(ctx: Ctx, node: yaml.MappingNode) -> str:
    entries = ctx.mapping(node, "errors", KEYS["errors"], ("template",))
    key: tuple[str, ...] = DEFAULT_KEY
    key_node: yaml.Node = entries["template"][1]
    if "key" in entries:
        key_node = entries["key"][1]
        text = ctx.string(key_node, "errors.key")
        if not DOTTED.match(text) or "{" in text or "}" in text:
            raise ctx.error(
                key_node, "errors.key", f"{text!r} is not a dotted key like 'receipt_proxy' or 'error.meta'"
            )
        key = tuple(text.split("."))
    template_node = entries["template"][1]
    if not isinstance(template_node, yaml.MappingNode):
        raise ctx.error(
            template_node,
            "errors.template",
            f"expected a mapping (the envelope's JSON object), got {node_kind(template_node)}",
        )
    template = _value(ctx, template_node, "errors.template", 1)
    _check_key(ctx, key_node, template, key)
    return canonical(template, key)


def _value(ctx: Ctx, node: yaml.Node, field_: str, depth: int) -> Any:
    """A template's value as JSON, each string's placeholders checked; each bad part reported, reading on."""
    if depth > MAX_DEPTH:
        raise ctx.error(node, field_, f"nested deeper than {MAX_DEPTH}: an error envelope is a few levels at most")
    if isinstance(node, yaml.MappingNode):
        out = {}
        for name, (key, value) in ctx.entries(node, field_).items():
            where = f"{field_}.{name}"
            if "{" in name or "}" in name:
                ctx.report(
                    ctx.error(key, where, f"a key is taken as written, never filled in: {name!r} cannot hold braces")
                )
                continue
            out[name] = ctx.attempt(_value, ctx, value, where, depth + 1)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [ctx.attempt(_value, ctx, item, f"{field_}[{i}]", depth + 1) for i, item in enumerate(node.value)]
    if node.tag == "tag:yaml.org,2002:str":
        try:
            pieces(node.value)
        except ValueError as e:
            raise ctx.error(node, field_, str(e)) from None
        return node.value
    value = scalar_value(node)
    json_like = value is None or isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value))
    if not json_like:
        raise ctx.error(
            node, field_, f"expected a JSON value (text, a number, true, false or null), got {node_kind(node)}"
        )
    return value


def _check_key(ctx: Ctx, node: yaml.Node, template: dict[str, Any], key: tuple[str, ...]) -> None:
    """The proxy's answer needs a place of its own: each step of `key` is a mapping of the template or
    absent, and the last one absent."""
    here: Any = template
    for i, step in enumerate(key):
        if step not in here:
            return
        here = here[step]
        where = ".".join(key[: i + 1])
        if i == len(key) - 1:
            raise ctx.error(
                node, "errors.key", f"the template already has {where}: the proxy's answer needs a place of its own"
            )
        if not isinstance(here, dict):
            raise ctx.error(
                node, "errors.key", f"the template's {where} is not a mapping: the proxy's answer cannot go in it"
            )
