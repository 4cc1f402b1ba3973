"""
Loading rules files: YAML text → RuleFile, and a file or a folder of them → RuleSet.

`load_rules` raises the first problem; `check_rules` lists them all, for `receipts rules check`:
every top-level key and every part of every operation is checked even after another has a
problem (nodes.Ctx.report and attempt), unless the YAML itself is broken. A part that another
depends on and that has a problem leaves what depends on it unchecked (a path template that
does not parse: the fingerprint's path parameters), never reported twice.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import yaml

from proxy_addon.errors import RulesError
from proxy_addon.rules.error_templates import load_errors
from proxy_addon.rules.load_decisions import with_file_decisions
from proxy_addon.rules.load_operation import Declared, declared_in, load_operation, method_override
from proxy_addon.rules.model import (
    ANY_TOOL,
    FROM_SERVER,
    IDENT,
    KEYS,
    MCP_ANNOTATIONS,
    MCP_TOOLS,
    FingerprintSpec,
    Operation,
    PathTemplate,
    RuleFile,
    parse_path_template,
)
from proxy_addon.rules.nodes import HEADER, Ctx, Entry, node_kind
from proxy_addon.rules.ruleset import RuleSet

_OPERATION_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_HOST = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*(:[0-9]{1,5})?\Z")

Credentials = tuple[Declared, str | None, str | None]  # the credentials declared, the env var and the scheme

# Rules files are data, not programs: no YAML aliases (a 0.7 KB file of aliases nested seven
# deep expands to 9^7 values), and a bound on the size of a file.
MAX_RULES_BYTES = 1024 * 1024


class _AliasRefused(yaml.composer.ComposerError):
    pass


class _RulesLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases (`*name`) before anything expands them."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _AliasRefused(None, None, f"*{event.anchor}", event.start_mark)
        return super().compose_node(parent, index)


def load_rules(text: str, source: str = "<rules>") -> RuleFile:
    """Parse one rules file. Raises RulesError naming `source`, the line and the field (the first problem)."""
    problems: list[RulesError] = []
    rf = _load(text, source, problems)
    if problems:
        raise problems[0]
    assert rf is not None
    return rf


def check_rules(text: str, source: str = "<rules>") -> list[RulesError]:
    """Every problem of one rules file, in line order, with the checks only `rules check` makes."""
    problems: list[RulesError] = []
    _load(text, source, problems, strict=True)
    return sorted(problems, key=lambda p: p.line or 0)


def load_rules_path(path: str | Path) -> RuleSet:
    """Load one rules file, or every `*.yaml`/`*.yml` file in a folder (sorted by name).
    Raises the first problem (`check_rules_path` lists them all)."""
    _, loaded, problems = _load_path(path)
    if problems:
        raise problems[0]
    return RuleSet.of(loaded)


def check_rules_path(path: str | Path, *, strict: bool = True) -> tuple[list[Path], list[RulesError]]:
    """The files checked and every problem found in them (`receipts rules check`), with the
    checks only `rules check` makes (a read that proves absence says how its list continues)
    unless `strict` is false: then only the problems that keep `load_rules_path` from loading."""
    files, _, problems = _load_path(path, strict=strict)
    order = {str(f): i for i, f in enumerate(files)}  # file by file, each from its top line down
    return files, sorted(problems, key=lambda p: (order.get(p.source, -1), p.line or 0))


def rules_files(path: str | Path) -> list[Path]:
    """The rules files a path names: itself, or every *.yaml/*.yml in a folder, sorted."""
    p = Path(path).expanduser()
    if p.is_dir():
        return sorted(x for x in p.iterdir() if x.suffix in (".yaml", ".yml") and x.is_file())
    return [p] if p.is_file() else []


def rules_signature(path: str | Path) -> tuple:
    """What changes when a rules file is edited, added or removed: names, sizes and mtimes."""
    try:
        return tuple((str(x), x.stat().st_mtime_ns, x.stat().st_size) for x in rules_files(path))
    except OSError:
        return ()


def _load_path(path: str | Path, *, strict: bool = False) -> tuple[list[Path], list[RuleFile], list[RulesError]]:
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
            size = file.stat().st_size
            if size > MAX_RULES_BYTES:
                problems.append(
                    RulesError(f"the file is {size} bytes; a rules file is at most {MAX_RULES_BYTES}", source=str(file))
                )
                continue
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            problems.append(RulesError(f"cannot read: {e}", source=str(file)))
            continue
        rf = _load(text, str(file), problems, strict=strict)
        if rf is None:
            continue
        other = next((o for o in loaded if o.api == rf.api), None)
        if other is not None:
            problems.append(
                RulesError(f"api {rf.api!r} is already defined in {other.source}", source=str(file), field="api")
            )
            continue
        loaded.append(rf)
    return files, loaded, problems


def _load(text: str, source: str, problems: list[RulesError], *, strict: bool = False) -> RuleFile | None:
    """One file: every problem found goes to `problems` (`strict`: with the checks only `rules check`
    makes); the RuleFile if there was none."""
    ctx = Ctx(source, strict=strict)
    try:
        rf = _load_file(ctx, text)
    except RulesError as e:  # the file could not be read on past this one
        ctx.report(e)
        rf = None
    problems.extend(ctx.problems)  # as found: loading raises the first (a key out of place before what it left empty)
    return rf if not ctx.problems else None


def _load_file(ctx: Ctx, text: str) -> RuleFile | None:
    """
    One file. Its top-level keys and each operation are read even after another has a problem
    (each problem reported to `ctx`); the file is None if any had one. Bad YAML, or a top level
    that is not a mapping, raises: nothing past it can be read.
    """
    node = _compose(text, ctx.source)
    top = ctx.mapping(node, "", KEYS["file"])
    for key in ("api", "hosts", "operations"):
        if key not in top:
            ctx.report(ctx.error(node, key, "is required"))
    api = ctx.attempt(ctx.string, top["api"][1], "api") if "api" in top else None
    hosts = ctx.attempt(_hosts, ctx, top) if "hosts" in top else None
    credentials = ctx.attempt(_credentials, ctx, top) or (Declared(), None, None)
    ctx.post_reads = _post_reads(ctx, top)
    if "method_override" in top:
        ctx.method_override = (
            ctx.attempt(method_override, ctx, top["method_override"][1], "method_override") or "honour"
        )
    errors = ctx.attempt(load_errors, ctx, top["errors"][1]) if "errors" in top else None
    endpoint = ctx.attempt(_mcp_endpoint, ctx, top, api or "", credentials) if "mcp" in top else None
    operations = (
        ctx.attempt(_operations, ctx, top, api or "", credentials, allow_none=endpoint is not None)
        if "operations" in top
        else None
    )
    if operations is not None and credentials[0].path and "credentials" in top:
        _check_credential_params(ctx, top["credentials"][1], credentials[0], [*operations, endpoint])
    if endpoint is not None and operations is not None:
        _named_reads(ctx, top["mcp"][1], endpoint, operations)
        operations.append(endpoint)  # after the file's own operations: an explicit rule wins
    if "decisions" in top and operations is not None:  # the file's, after each operation's own
        operations = ctx.attempt(with_file_decisions, ctx, top["decisions"][1], operations)
    if ctx.problems or api is None or hosts is None or operations is None:
        return None
    if errors is not None:
        operations = [replace(op, errors=errors) for op in operations]
    return RuleFile(
        api=api, hosts=tuple(hosts), operations=tuple(operations), source=ctx.source, post_reads=ctx.post_reads
    )


def _compose(text: str, source: str) -> yaml.Node:
    """The YAML node tree of a file; RulesError for bad YAML or an empty file."""
    try:
        node = yaml.compose(text, Loader=_RulesLoader)
    except _AliasRefused as e:
        line = e.problem_mark.line + 1 if e.problem_mark else None
        raise RulesError(
            f"YAML aliases ({e.problem}) are not allowed in rules files: write the value out where it is used",
            source=source,
            line=line,
        ) from None
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
    return node


def _hosts(ctx: Ctx, top: dict[str, Entry]) -> list[str]:
    hosts = []
    for item, host in ctx.strings(top["hosts"][1], "hosts", allow_empty=False):
        if not _HOST.match(host) or (":" in host and not 1 <= int(host.rsplit(":", 1)[1]) <= 65535):
            ctx.report(
                ctx.error(item, "hosts", f"{host!r} is not a host name (lower case, optional '*.' prefix and ':port')")
            )
            continue
        hosts.append(host)
    return hosts


def _credentials(ctx: Ctx, top: dict[str, Entry]) -> Credentials:
    """
    `credentials:`: where they are in a request (headers, lower case, also set on ctx; query
    parameters; body fields; path parameters), the env var and the scheme for CLI reads.
    """
    declared = Declared()
    credentials_env = credentials_scheme = None
    if "credentials" in top:
        cred = ctx.mapping(top["credentials"][1], "credentials", KEYS["credentials"])
        declared = declared_in(ctx, top["credentials"][1], cred, "credentials")
        ctx.credential_headers = declared.header
        if "env" in cred:
            credentials_env = ctx.string(cred["env"][1], "credentials.env")
            if not IDENT.match(credentials_env):
                raise ctx.error(
                    cred["env"][1], "credentials.env", f"{credentials_env!r} is not an environment variable name"
                )
        if "scheme" in cred:
            credentials_scheme = ctx.string(cred["scheme"][1], "credentials.scheme")
            if not HEADER.match(credentials_scheme):
                raise ctx.error(
                    cred["scheme"][1],
                    "credentials.scheme",
                    f"{credentials_scheme!r} is not an auth scheme like Bearer or Token",
                )
    return declared, credentials_env, credentials_scheme


def _check_credential_params(ctx: Ctx, node: yaml.Node, declared: Declared, ops: list[Operation | None]) -> None:
    """`credentials.path` of the file names parameters that some operation's path has (a typo protects nothing)."""
    params = {p for op in ops if op is not None for p in op.path.params}
    for name in declared.path:
        if name not in params:
            ctx.report(
                ctx.error(node, "credentials.path", f"{name!r} is a parameter of no operation's path in this file")
            )


def _post_reads(ctx: Ctx, top: dict[str, Entry]) -> tuple[PathTemplate, ...]:
    """`post_reads:`: the POST paths of this API that only read (a search), which a reconcile read may use."""
    post_reads = []
    items = ctx.attempt(ctx.strings, top["post_reads"][1], "post_reads") if "post_reads" in top else None
    for item, template in items or ():
        try:
            post_reads.append(parse_path_template(template))
        except ValueError as e:
            ctx.report(ctx.error(item, "post_reads", str(e)))
    return tuple(post_reads)


def _mcp_endpoint(ctx: Ctx, top: dict[str, Entry], api: str, credentials: Credentials) -> Operation | None:
    """
    `mcp: {path, tools, annotations, read_only_tools}`: the file's MCP endpoint. `tools: from_server`
    adds an operation (`from_server`, after the file's own) that takes every tool call to the
    endpoint which no operation names: a write, fingerprinted on all its arguments, unless the
    rules name the tool a read (`read_only_tools`), or the server's annotations are trusted
    (`annotations: trusted`) and its tools/list declares the tool read-only (the proxy learns
    that from the answers it passes: rules/tool_catalog.py). The MCP specification calls annotations
    untrusted unless they come from a trusted server: by default, they make no read.
    `tools: declared` (the default): only the operations below.
    """
    node = top["mcp"][1]
    m = ctx.mapping(node, "mcp", KEYS["mcp_endpoint"], ("path",))
    try:
        path = parse_path_template(ctx.string(m["path"][1], "mcp.path"))
    except ValueError as e:
        raise ctx.error(m["path"][1], "mcp.path", str(e)) from None
    tools = ctx.string(m["tools"][1], "mcp.tools") if "tools" in m else "declared"
    if tools not in MCP_TOOLS:
        raise ctx.error(m["tools"][1], "mcp.tools", f"{tools!r} is not one of {', '.join(MCP_TOOLS)}")
    annotations = ctx.string(m["annotations"][1], "mcp.annotations") if "annotations" in m else "untrusted"
    if annotations not in MCP_ANNOTATIONS:
        raise ctx.error(
            m["annotations"][1], "mcp.annotations", f"{annotations!r} is not one of {', '.join(MCP_ANNOTATIONS)}"
        )
    reads = (
        [name for _, name in ctx.strings(m["read_only_tools"][1], "mcp.read_only_tools")]
        if "read_only_tools" in m
        else []
    )
    if tools != FROM_SERVER:
        for key in ("annotations", "read_only_tools"):
            if key in m:
                raise ctx.error(m[key][1], f"mcp.{key}", "is read only with tools: from_server")
        return None
    return Operation(
        api=api,
        name=FROM_SERVER,
        method="POST",
        path=path,
        fingerprint=FingerprintSpec(path=(), body=None),
        credential_headers=credentials[0].header,
        credential_query=credentials[0].query,
        credential_body=credentials[0].body,
        credential_path=tuple(p for p in credentials[0].path if p in path.params),
        credentials_env=credentials[1],
        credentials_scheme=credentials[2],
        mcp_tool=ANY_TOOL,
        mcp_read_tools=tuple(reads),
        mcp_trusts_annotations=annotations == "trusted",
        source=ctx.source,
        line=node.start_mark.line + 1,
        description="every tool the rules do not name a read (mcp.tools: from_server)",
    )


def _named_reads(ctx: Ctx, node: yaml.Node, endpoint: Operation, operations: list[Operation]) -> None:
    """A tool `mcp.read_only_tools` names a read that an operation names a write: which is it? Reported."""
    writes = {op.mcp_tool for op in operations if op.mcp_tool is not None}
    if both := [name for name in endpoint.mcp_read_tools if name in writes]:
        ctx.report(
            ctx.error(
                node,
                "mcp.read_only_tools",
                f"names {', '.join(both)}, which an operation of this file names a write: list it in one place",
            )
        )


def _operations(
    ctx: Ctx, top: dict[str, Entry], api: str, credentials: Credentials, *, allow_none: bool = False
) -> list[Operation]:
    """The operations that load; each problem of each one is reported to `ctx` and the next one read."""
    declared, credentials_env, credentials_scheme = credentials
    ops_node = top["operations"][1]
    if allow_none and isinstance(ops_node, yaml.ScalarNode) and ops_node.value in ("", "~", "null"):
        return []
    if not isinstance(ops_node, yaml.MappingNode):
        raise ctx.error(ops_node, "operations", f"expected a mapping of operation names, got {node_kind(ops_node)}")
    ops_map = ctx.entries(ops_node, "operations")
    if not ops_map and not allow_none:
        raise ctx.error(ops_node, "operations", "must list at least one operation")
    operations = []
    for name, (key, value) in ops_map.items():
        before = len(ctx.problems)
        if not _OPERATION_NAME.match(name):
            ctx.report(ctx.error(key, f"operations.{name}", "operation names use letters, digits, '.', '_' and '-'"))
        op = ctx.attempt(load_operation, ctx, api, name, value, declared, credentials_env)
        if op is not None and len(ctx.problems) == before:
            operations.append(replace(op, credentials_scheme=credentials_scheme, line=key.start_mark.line + 1))
    return operations
