"""
Reading YAML nodes strictly: each value checked for its shape, each problem a RulesError
naming the file, the line and the field.

    ctx = Ctx("rules/dev.to.yaml")
    top = ctx.mapping(node, "", KEYS["file"], ("api", "hosts", "operations"))
    api = ctx.string(top["api"][1], "api")     # else: "api: expected a non-empty string, got int 3"

A file's every problem is wanted in one run (`receipts rules check`), so a problem that leaves
the rest readable is reported (`ctx.report`: an unknown or duplicate key, one bad item of a
list) and reading goes on; one that does not (a mapping that is a list) raises, and the loaders
run each part that the others do not depend on with `ctx.attempt`, which reports what it raises.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import yaml

from proxy_addon.errors import RulesError
from proxy_addon.rules.model import TEMPLATE_VAR, PathTemplate

DOTTED = re.compile(r"^[^.\s]+(\.[^.\s]+)*\Z")
HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_DURATION = re.compile(r"^([0-9]+)\s*(s|m|h|d)?\Z")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}

Entry = tuple[yaml.Node, yaml.Node]  # a key's node and its value's, as Ctx.mapping returns them
T = TypeVar("T")


class Ctx:
    """One file being loaded: its name for errors, and what its top level says that operations need."""

    def __init__(self, source: str, *, strict: bool = False):
        self.source = source
        self.strict = strict  # `rules check`: also the checks only it makes (loader.check_rules)
        self.problems: list[RulesError] = []  # every problem reported so far, reading went on past each
        self.post_reads: tuple[PathTemplate, ...] = ()
        self.credential_headers: tuple[str, ...] = ()
        self.credential_params: frozenset[str] = frozenset()  # the operation's path parameters that are credentials
        self.method_override = "honour"  # the file's `method_override:`, each operation's default

    def error(self, node: yaml.Node | None, field_: str, message: str) -> RulesError:
        line = node.start_mark.line + 1 if node is not None else None
        return RulesError(message, source=self.source, line=line, field=field_)

    def report(self, problem: RulesError) -> None:
        """A problem that leaves the rest readable: noted, and reading goes on."""
        self.problems.append(problem)

    def attempt(self, load: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """`load(...)`, one part the others do not depend on; what it raises is reported, and None returned."""
        try:
            return load(*args, **kwargs)
        except RulesError as e:
            self.report(e)
            return None

    def mapping(
        self, node: yaml.Node, field_: str, allowed: Iterable[str], required: Iterable[str] = ()
    ) -> dict[str, Entry]:
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, field_, f"expected a mapping, got {node_kind(node)}")
        allowed = tuple(allowed)
        out: dict[str, Entry] = {}
        for key, value in node.value:  # a bad key is reported and left out; the others are read
            if not isinstance(key, yaml.ScalarNode):
                self.report(self.error(key, field_, "keys must be plain strings"))
                continue
            name = key.value
            where = f"{field_}.{name}" if field_ else name
            if name in out:
                self.report(self.error(key, where, "duplicate key"))
            elif name not in allowed:
                self.report(self.error(key, where, f"unknown key {name!r}; expected one of: {', '.join(allowed)}"))
            else:
                out[name] = (key, value)
        for name in required:
            if name not in out:
                raise self.error(node, f"{field_}.{name}" if field_ else name, "is required")
        return out

    def entries(self, node: yaml.Node, field_: str) -> dict[str, Entry]:
        """A mapping whose keys are the user's own (operation names, fields, headers)."""
        keys = (
            [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
            if isinstance(node, yaml.MappingNode)
            else []
        )
        return self.mapping(node, field_, keys)

    def string(self, node: yaml.Node, field_: str) -> str:
        if not isinstance(node, yaml.ScalarNode) or node.tag != "tag:yaml.org,2002:str" or node.value == "":
            raise self.error(node, field_, f"expected a non-empty string, got {node_kind(node)}")
        return node.value

    def strings(self, node: yaml.Node, field_: str, *, allow_empty: bool = True) -> list[tuple[yaml.Node, str]]:
        items: list[yaml.Node]
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:str":
            items = [node]
        elif isinstance(node, yaml.SequenceNode):
            items = node.value
        else:
            raise self.error(node, field_, f"expected a list of strings, got {node_kind(node)}")
        if not items and not allow_empty:
            raise self.error(node, field_, "must not be empty")
        out: list[tuple[yaml.Node, str]] = []
        seen = set()
        for i, item in enumerate(items):  # a bad item is reported and left out
            value = self.attempt(self.string, item, f"{field_}[{i}]")
            if value is None:
                continue
            if value in seen:
                self.report(self.error(item, f"{field_}[{i}]", f"{value!r} is listed twice"))
                continue
            seen.add(value)
            out.append((item, value))
        return out

    def boolean(self, node: yaml.Node, field_: str) -> bool:
        if not isinstance(node, yaml.ScalarNode) or node.tag != "tag:yaml.org,2002:bool":
            raise self.error(node, field_, f"expected true or false, got {node_kind(node)}")
        return node.value.lower() in ("true", "yes", "on")

    def duration(self, node: yaml.Node, field_: str) -> int:
        """Seconds, from `30s`, `5m`, `1h`, `1d` or a bare number."""
        text = node.value if isinstance(node, yaml.ScalarNode) else ""
        m = _DURATION.match(text.strip())
        if not m or node.tag not in ("tag:yaml.org,2002:str", "tag:yaml.org,2002:int"):
            raise self.error(node, field_, f"expected a duration like 30s, 5m, 1h or 1d, got {node_kind(node)}")
        return int(m.group(1)) * _UNIT[m.group(2)]

    def template(self, node: yaml.Node, field_: str, allowed: set[str] | None) -> str:
        """A string whose `{name}`s are all in `allowed` (see model.template_variables); None: names
        unchecked (the operation's fingerprint has a problem of its own, so what it records is unknown)."""
        text = self.string(node, field_)
        stripped = TEMPLATE_VAR.sub("", text)
        if "{" in stripped or "}" in stripped:
            raise self.error(node, field_, f"unbalanced '{{' or '}}' in template {text!r}")
        for var in TEMPLATE_VAR.findall(text):
            if var.startswith("path.") and var[5:] in self.credential_params:
                raise self.error(
                    node,
                    field_,
                    f"{{{var}}} carries a credential (credentials.path, or a name like a credential's): the receipt "
                    "keeps only a keyed hash of it, so a read cannot use it",
                )
            if allowed is not None and var not in allowed:
                known = ", ".join(sorted(allowed))
                raise self.error(
                    node,
                    field_,
                    f"{{{var}}} is not recorded by this operation's fingerprint; templates may use: {known}",
                )
        return text

    def fields(
        self, node: yaml.Node, field_: str, templates: set[str] | None = None, *, in_read: bool = False
    ) -> str | tuple[str, ...]:
        """A dotted field path, or a list of them (a composite id, joined with ':'). In a read (`in_read`),
        a list item may be a template of the receipt (`{intent.channel}`, its names checked against
        `templates` unless None), for reads whose items lack a part."""
        if isinstance(node, yaml.SequenceNode):
            items = self.strings(node, field_, allow_empty=False)
        else:
            items = [(node, self.string(node, field_))]
        for item, name in items:
            if in_read and isinstance(node, yaml.SequenceNode) and TEMPLATE_VAR.fullmatch(name):
                self.template(item, field_, templates)
            elif not DOTTED.match(name) or "{" in name:
                raise self.error(item, field_, f"{name!r} is not a dotted field path like 'id' or 'data.id'")
        names = tuple(name for _, name in items)
        return names[0] if not isinstance(node, yaml.SequenceNode) else names


def node_kind(node: yaml.Node) -> str:
    """What a node is, for an error message: a mapping, a list, nothing, or `int 3`."""
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    tag = node.tag.rsplit(":", 1)[-1]
    if tag == "null" or node.value == "":
        return "nothing"
    return f"{tag} {node.value!r}"


def scalar_value(node: yaml.Node) -> Any:
    """A YAML scalar as the JSON value it stands for."""
    if node.tag == "tag:yaml.org,2002:str":
        return node.value
    return yaml.safe_load(node.value)
