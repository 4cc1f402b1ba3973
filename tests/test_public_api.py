"""
The public surface, pinned as httpx pins its own (tests/test_exports.py there): each package's
`__all__` is an explicit sorted list, every name in it is importable and is the object its home
module defines, and nothing else public leaks. And the layers: only proxy_addon/mitm/ imports
mitmproxy, and only proxy_addon/store/ talks SQL; no folder imports one above it, and no folders
import each other in a circle, lazy imports inside functions included; every module name is used once.

The order of proxy_addon/'s folders (LAYERS below), bottom first; each imports only from below it:

    errors.py      the exceptions
    states.py      the receipt states and their transitions
    wire/          what a request and an answer say
    proof/         the hash chain and signed checkpoints, without SQL
    store/         SQL only, both backends
    rules/         the YAML model and its loader
    intent/        fingerprint, body view, principal
    outcome/       classification, the proxy's own answers
    reconcile/     the reads that settle an unknown outcome
    gate/          admit, wait, decide, record
    explain/       `receipts rules explain`
    draft/         `receipts rules draft` (beside explain/: neither imports the other)
    mitm/, cli/    the two front ends (neither imports the other)
    __init__.py, addon.py   the public names; the script mitmdump loads
"""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "proxy_addon"

# name → (the module that defines it, its name there)
PUBLIC: dict[str, dict[str, tuple[str, str]]] = {
    "proxy_addon": {
        "Attempt": ("proxy_addon.store.records", "Attempt"),
        "Decision": ("proxy_addon.store.records", "Decision"),
        "Event": ("proxy_addon.store.records", "Event"),
        "IllegalTransition": ("proxy_addon.errors", "IllegalTransition"),
        "Receipt": ("proxy_addon.store.records", "Receipt"),
        "ReceiptsError": ("proxy_addon.errors", "ReceiptsError"),
        "RuleSet": ("proxy_addon.rules.ruleset", "RuleSet"),
        "RulesError": ("proxy_addon.errors", "RulesError"),
        "State": ("proxy_addon.states", "State"),
        "Store": ("proxy_addon.store.sqlite", "SQLiteStore"),
        "StoreError": ("proxy_addon.errors", "StoreError"),
        "StoreUnavailable": ("proxy_addon.errors", "StoreUnavailable"),
        "TRANSITIONS": ("proxy_addon.states", "TRANSITIONS"),
        "UNRESOLVED": ("proxy_addon.states", "UNRESOLVED"),
        "UnknownReceipt": ("proxy_addon.errors", "UnknownReceipt"),
        "load_rules": ("proxy_addon.rules.loader", "load_rules"),
        "load_rules_path": ("proxy_addon.rules.loader", "load_rules_path"),
    },
    "proxy_addon.store": {
        "ApprovalDecision": ("proxy_addon.store.records", "ApprovalDecision"),
        "Attempt": ("proxy_addon.store.records", "Attempt"),
        "Backend": ("proxy_addon.store.base", "Backend"),
        "Clock": ("proxy_addon.store.records", "Clock"),
        "Decision": ("proxy_addon.store.records", "Decision"),
        "DecisionKind": ("proxy_addon.store.records", "DecisionKind"),
        "Enforcement": ("proxy_addon.store.records", "Enforcement"),
        "Example": ("proxy_addon.store.records", "Example"),
        "WOULD_HAVE": ("proxy_addon.store.records", "WOULD_HAVE"),
        "Dialect": ("proxy_addon.store.base", "Dialect"),
        "Event": ("proxy_addon.store.records", "Event"),
        "Held": ("proxy_addon.store.versions", "Held"),
        "Interim": ("proxy_addon.store.records", "Interim"),
        "PostgresStore": ("proxy_addon.store.postgres", "PostgresStore"),
        "Receipt": ("proxy_addon.store.records", "Receipt"),
        "ReceiptStore": ("proxy_addon.store.receipts", "ReceiptStore"),
        "RecordedResponse": ("proxy_addon.store.records", "RecordedResponse"),
        "SQLiteStore": ("proxy_addon.store.sqlite", "SQLiteStore"),
        "Store": ("proxy_addon.store.sqlite", "SQLiteStore"),
        "StoredAnswer": ("proxy_addon.store.records", "StoredAnswer"),
        "UniqueViolation": ("proxy_addon.store.base", "UniqueViolation"),
        "is_postgres": ("proxy_addon.store.dsn", "is_postgres"),
        "iso": ("proxy_addon.store.records", "iso"),
        "new_operation_id": ("proxy_addon.store.records", "new_operation_id"),
        "open_store": ("proxy_addon.store", "open_store"),
        "utcnow": ("proxy_addon.store.records", "utcnow"),
    },
    "proxy_addon.rules": {
        "AFTER_SUCCESS": ("proxy_addon.rules.model", "AFTER_SUCCESS"),
        "ALREADY_EXISTS": ("proxy_addon.rules.model", "ALREADY_EXISTS"),
        "ANY_TOOL": ("proxy_addon.rules.model", "ANY_TOOL"),
        "CLASSIFIABLE": ("proxy_addon.rules.model", "CLASSIFIABLE"),
        "FROM_SERVER": ("proxy_addon.rules.model", "FROM_SERVER"),
        "KEYS": ("proxy_addon.rules.model", "KEYS"),
        "METHODS": ("proxy_addon.rules.model", "METHODS"),
        "TEMPLATE_VAR": ("proxy_addon.rules.model", "TEMPLATE_VAR"),
        "AfterSuccess": ("proxy_addon.rules.model", "AfterSuccess"),
        "Check": ("proxy_addon.rules.model", "Check"),
        "ClassifyRule": ("proxy_addon.rules.model", "ClassifyRule"),
        "FingerprintSpec": ("proxy_addon.rules.model", "FingerprintSpec"),
        "Match": ("proxy_addon.rules.model", "Match"),
        "Operation": ("proxy_addon.rules.model", "Operation"),
        "PathTemplate": ("proxy_addon.rules.model", "PathTemplate"),
        "ReconcileSpec": ("proxy_addon.rules.model", "ReconcileSpec"),
        "RuleFile": ("proxy_addon.rules.model", "RuleFile"),
        "RuleSet": ("proxy_addon.rules.ruleset", "RuleSet"),
        "check_rules": ("proxy_addon.rules.loader", "check_rules"),
        "check_rules_path": ("proxy_addon.rules.loader", "check_rules_path"),
        "host_pattern": ("proxy_addon.rules.ruleset", "host_pattern"),
        "load_rules": ("proxy_addon.rules.loader", "load_rules"),
        "load_rules_path": ("proxy_addon.rules.loader", "load_rules_path"),
        "parse_path_template": ("proxy_addon.rules.model", "parse_path_template"),
        "read_variables": ("proxy_addon.rules.model", "read_variables"),
        "rules_files": ("proxy_addon.rules.loader", "rules_files"),
        "rules_signature": ("proxy_addon.rules.loader", "rules_signature"),
        "template_variables": ("proxy_addon.rules.model", "template_variables"),
    },
    "proxy_addon.draft": {
        "ApiDocument": ("proxy_addon.draft.openapi_document", "ApiDocument"),
        "DraftFile": ("proxy_addon.draft.draft_model", "DraftFile"),
        "DraftOperation": ("proxy_addon.draft.draft_model", "DraftOperation"),
        "draft_openapi": ("proxy_addon.draft.openapi_draft", "draft_openapi"),
        "parse_document": ("proxy_addon.draft.openapi_document", "parse_document"),
        "read_document": ("proxy_addon.draft.openapi_document", "read_document"),
        "write_draft": ("proxy_addon.draft.draft_yaml", "write_draft"),
    },
    "proxy_addon.explain": {
        "BODY_LIMIT": ("proxy_addon.explain.report", "BODY_LIMIT"),
        "SHOWN": ("proxy_addon.explain.render", "SHOWN"),
        "explain": ("proxy_addon.explain.report", "explain"),
        "render": ("proxy_addon.explain.render", "render"),
    },
    "proxy_addon.mitm": {
        "ApprovalServer": ("proxy_addon.mitm.approval_server", "ApprovalServer"),
        "ApprovalWebhook": ("proxy_addon.mitm.approval_webhook", "ApprovalWebhook"),
        "LearnFile": ("proxy_addon.mitm.learn_file", "LearnFile"),
        "MetricsServer": ("proxy_addon.mitm.metrics_server", "MetricsServer"),
        "ReceiptCommands": ("proxy_addon.mitm.flow_commands", "ReceiptCommands"),
        "ReceiptWeb": ("proxy_addon.mitm.web", "ReceiptWeb"),
        "Receipts": ("proxy_addon.mitm.receipts_addon", "Receipts"),
        "Watch": ("proxy_addon.mitm.watch", "Watch"),
        "make_addons": ("proxy_addon.mitm", "make_addons"),
    },
}

# The lists, written out: a name added to or dropped from a package's surface fails here.
ALL = {
    "proxy_addon": [
        "TRANSITIONS",
        "UNRESOLVED",
        "Attempt",
        "Decision",
        "Event",
        "IllegalTransition",
        "Receipt",
        "ReceiptsError",
        "RuleSet",
        "RulesError",
        "State",
        "Store",
        "StoreError",
        "StoreUnavailable",
        "UnknownReceipt",
        "load_rules",
        "load_rules_path",
    ],
    "proxy_addon.store": [
        "WOULD_HAVE",
        "ApprovalDecision",
        "Attempt",
        "Backend",
        "Clock",
        "Decision",
        "DecisionKind",
        "Dialect",
        "Enforcement",
        "Event",
        "Example",
        "Held",
        "Interim",
        "PostgresStore",
        "Receipt",
        "ReceiptStore",
        "RecordedResponse",
        "SQLiteStore",
        "Store",
        "StoredAnswer",
        "UniqueViolation",
        "is_postgres",
        "iso",
        "new_operation_id",
        "open_store",
        "utcnow",
    ],
    "proxy_addon.rules": [
        "AFTER_SUCCESS",
        "ALREADY_EXISTS",
        "ANY_TOOL",
        "CLASSIFIABLE",
        "FROM_SERVER",
        "KEYS",
        "METHODS",
        "TEMPLATE_VAR",
        "AfterSuccess",
        "Check",
        "ClassifyRule",
        "FingerprintSpec",
        "Match",
        "Operation",
        "PathTemplate",
        "ReconcileSpec",
        "RuleFile",
        "RuleSet",
        "check_rules",
        "check_rules_path",
        "host_pattern",
        "load_rules",
        "load_rules_path",
        "parse_path_template",
        "read_variables",
        "rules_files",
        "rules_signature",
        "template_variables",
    ],
    "proxy_addon.draft": [
        "ApiDocument",
        "DraftFile",
        "DraftOperation",
        "draft_openapi",
        "parse_document",
        "read_document",
        "write_draft",
    ],
    "proxy_addon.explain": ["BODY_LIMIT", "SHOWN", "explain", "render"],
    "proxy_addon.mitm": [
        "ApprovalServer",
        "ApprovalWebhook",
        "LearnFile",
        "MetricsServer",
        "ReceiptCommands",
        "ReceiptWeb",
        "Receipts",
        "Watch",
        "make_addons",
    ],
}

PACKAGES = list(ALL)
FUTURE_FEATURE = type(importlib.import_module("__future__").annotations)  # `from __future__ import annotations`


def isort_style(name: str) -> tuple[int, str]:
    """The order ruff's RUF022 keeps `__all__` in: SCREAMING_CASE, then CamelCase, then the rest, each sorted."""
    if name.isupper():
        return 0, name
    return (1 if name[:1].isupper() else 2), name


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_the_explicit_sorted_list(package):
    assert ALL[package] == sorted(ALL[package], key=isort_style)
    assert sorted(PUBLIC[package], key=isort_style) == ALL[package]
    assert importlib.import_module(package).__all__ == ALL[package]


@pytest.mark.parametrize("package", PACKAGES)
def test_star_import_gives_exactly_all(package):
    namespace: dict = {}
    exec(f"from {package} import *", namespace)
    assert sorted((k for k in namespace if k != "__builtins__"), key=isort_style) == ALL[package]


@pytest.mark.parametrize(("package", "name"), [(p, n) for p in PACKAGES for n in ALL[p]])
def test_each_name_is_what_its_home_module_defines(package, name):
    obj = getattr(importlib.import_module(package), name)
    home, defined_as = PUBLIC[package][name]
    assert obj is getattr(importlib.import_module(home), defined_as)
    if inspect.isclass(obj) or inspect.isfunction(obj):  # defined there, not merely imported there
        assert (obj.__module__, obj.__qualname__) == (home, defined_as)


@pytest.mark.parametrize("package", PACKAGES)
def test_nothing_else_public_leaks(package):
    """Every public, non-module name of the package is in `__all__` (as httpx checks its own)."""
    module = importlib.import_module(package)
    public = {
        k
        for k, v in vars(module).items()
        if not k.startswith("_") and not isinstance(v, types.ModuleType | FUTURE_FEATURE)
    }
    assert sorted(public, key=isort_style) == ALL[package]


# --- the layers ----------------------------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """Every module an import statement names (`from a import b` names a and a.b), with its line; relative resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names if alias.name != "*"]
    return found


def under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def sources(exclude: tuple[str, ...] = ()) -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if not any(p.is_relative_to(PACKAGE / e) for e in exclude)]


MITM_ALLOWED = ("mitm", "addon.py")  # the layer itself, and the script mitmproxy loads


@pytest.mark.parametrize(
    ("source", "module", "flagged"),
    [
        ("import mitmproxy", "proxy_addon.states", True),
        ("import mitmproxy.http as h", "proxy_addon.states", True),
        ("from mitmproxy import http", "proxy_addon.states", True),
        ("from proxy_addon import mitm", "proxy_addon.states", True),
        ("from proxy_addon.mitm.exchange import send", "proxy_addon.states", True),
        ("from .mitm import exchange", "proxy_addon.states", True),
        ("from ..mitm import exchange", "proxy_addon.cli.command_table", True),
        ("def f():\n    import mitmproxy.ctx\n", "proxy_addon.states", True),  # a lazy import counts too
        ("import mitmproxy_like", "proxy_addon.states", False),
        ("from proxy_addon import store", "proxy_addon.states", False),
        ("from . import mitm_notes", "proxy_addon.states", False),
    ],
)
def test_the_import_check_sees_what_it_must(source, module, flagged):
    names = [n for _, n in imports_of(source, module)]
    assert any(under(n, "mitmproxy", "proxy_addon.mitm") for n in names) is flagged


def test_only_the_mitm_layer_imports_mitmproxy():
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sources(exclude=MITM_ALLOWED)
        for line, name in imports_of(path.read_text(), module_name(path), is_package=path.name == "__init__.py")
        if under(name, "mitmproxy", "proxy_addon.mitm")
    ]
    assert offenders == []
    # The check is not vacuous: the layer itself does import mitmproxy.
    exchange = PACKAGE / "mitm" / "exchange.py"
    assert any(under(n, "mitmproxy") for _, n in imports_of(exchange.read_text(), "proxy_addon.mitm.exchange"))


def test_importing_every_core_module_loads_no_mitmproxy():
    """Transitively too: every module outside the layer imports without mitmproxy being loaded."""
    modules = [module_name(p) for p in sources(exclude=MITM_ALLOWED) if p.name != "__main__.py"]
    assert "proxy_addon.gate.admission" in modules and "proxy_addon.cli" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m == 'mitmproxy' or m.startswith('mitmproxy.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


SQL_CALLS = {"execute", "executemany", "executescript"}
SQL_DRIVERS = ("sqlite3", "sqlite_utils")


def sql_calls(source: str) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SQL_CALLS
    ]


def test_only_the_store_executes_sql():
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sources(exclude=("store",))
        for line in sql_calls(path.read_text())
    ]
    assert offenders == []
    assert sql_calls((PACKAGE / "store" / "sqlite.py").read_text())  # the check finds the store's own


def test_only_the_store_imports_the_database_driver():
    """The CLI and the proxy know the store's errors (StoreError), never the driver's."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sources(exclude=("store",))
        for line, name in imports_of(path.read_text(), module_name(path), is_package=path.name == "__init__.py")
        if under(name, *SQL_DRIVERS)
    ]
    assert offenders == []
    store = PACKAGE / "store" / "sqlite.py"
    assert any(under(n, "sqlite3") for _, n in imports_of(store.read_text(), "proxy_addon.store.sqlite"))


# --- the folders' order --------------------------------------------------------------------------

# proxy_addon/'s folders and top-level modules, bottom first, as the data flows (flow -> rule -> intent
# -> receipt -> state -> answer). Each may import those on the levels below its own, never one above
# nor one beside it on its level: the order is the code's, read from its imports.
LAYERS: list[tuple[str, ...]] = [
    ("errors",),  # the exceptions every layer raises
    ("states",),  # the receipt states and their transitions
    ("wire",),  # what a request and an answer say: parsing, canonical forms, redaction
    ("proof",),  # the events' hash chain and its signed checkpoints: canonical JSON, hashes, notes
    ("store",),  # SQL only, both backends
    ("rules",),  # the YAML model and its loader
    ("intent",),  # the fingerprint, the body view, the principal
    ("outcome",),  # classification and the proxy's own answers
    ("reconcile",),  # the reads that settle an unknown outcome
    ("gate",),  # admit, wait, decide, record: the runtime between a flow and the store
    # `receipts rules explain`: what the proxy would do, without a proxy; `receipts rules draft`: rules drafted
    # from an API's OpenAPI document or the traffic seen (the proxy's receipts_learn records it: mitm/ imports it)
    ("explain", "draft"),
    ("mitm", "cli"),  # the two front ends: mitmproxy's addon, the receipts CLI
    ("__init__", "addon"),  # the package's public names; the script `mitmdump -s` loads
]
LEVEL = {unit: n for n, units in enumerate(LAYERS) for unit in units}


def unit_of_path(path: Path) -> str:
    """The folder of proxy_addon/ a file is in, or its own name for a top-level module."""
    first = path.relative_to(PACKAGE).parts[0]
    return first.removesuffix(".py")


def unit_of_import(name: str) -> str | None:
    """
    The unit an imported name belongs to, None outside proxy_addon/. Bare `proxy_addon` (the way to a
    submodule: `from proxy_addon import store`) is none; a name from the package itself
    (`from proxy_addon import Receipt`) is its `__init__`.
    """
    parts = name.split(".")
    if parts[0] != "proxy_addon" or len(parts) == 1:
        return None
    return parts[1] if parts[1] in LEVEL else "__init__"


def unit_imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """The units of proxy_addon/ a file imports (lazy imports too), with their lines; its own unit left out."""
    text = path.read_text() if source is None else source
    own = unit_of_path(path)
    found = []
    for line, name in imports_of(text, module_name(path), is_package=path.name == "__init__.py"):
        unit = unit_of_import(name)
        if unit is not None and unit != own:
            found.append((line, unit))
    return found


def upward(path: Path, source: str | None = None) -> list[str]:
    own = LEVEL[unit_of_path(path)]
    return [
        f"{path.relative_to(ROOT)}:{line} imports {unit}/ (level {LEVEL[unit]} >= {own})"
        for line, unit in unit_imports(path, source)
        if LEVEL[unit] >= own
    ]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle in a directed graph, each once, as the list of its nodes from its smallest one."""
    found: set[tuple[str, ...]] = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == path[0]:
                found.add(tuple(path))
            elif nxt not in path and nxt > path[0]:  # each circle is found from its smallest node only
                walk(nxt, [*path, nxt])

    for start in sorted(graph):
        walk(start, [start])
    return [list(c) for c in sorted(found)]


def test_the_layers_name_every_folder_and_top_module():
    units = {unit_of_path(p) for p in sources() if p.parent != PACKAGE or p.name != "__main__.py"}
    assert sorted(units) == sorted(LEVEL)


@pytest.mark.parametrize(
    ("where", "source", "flagged"),
    [
        ("rules/loader.py", "from proxy_addon.gate.paths import default_rules", True),
        ("rules/loader.py", "def f():\n    from proxy_addon.gate import paths\n", True),  # a lazy import counts too
        ("rules/loader.py", "from ..intent import fingerprint", True),  # relative, resolved
        ("rules/loader.py", "from proxy_addon import Receipt", True),  # the package's public names are the top
        ("mitm/flows.py", "from proxy_addon.cli import main", True),  # one beside it on its level
        ("states.py", "from proxy_addon.wire import bodies", True),
        ("rules/loader.py", "from proxy_addon import errors", False),
        ("rules/loader.py", "from proxy_addon.wire.jsonpath import parse", False),
        ("rules/loader.py", "from . import model", False),  # its own folder
        ("cli/values.py", "from proxy_addon.gate.paths import default_db", False),
        ("addon.py", "from proxy_addon.mitm import make_addons", False),
    ],
)
def test_the_layer_check_sees_what_it_must(where, source, flagged):
    assert bool(upward(PACKAGE / where, source)) is flagged


def test_no_folder_imports_one_above_it():
    offenders = [line for path in sources() for line in upward(path)]
    assert offenders == []


def test_no_circle_between_folders():
    graph: dict[str, set[str]] = {}
    for path in sources():
        graph.setdefault(unit_of_path(path), set()).update(unit for _, unit in unit_imports(path))
    assert cycles(graph) == []
    # The check is not vacuous: it sees the folders' imports, and a circle when there is one.
    assert {"wire", "store", "rules"} <= graph["intent"]
    assert cycles({**graph, "wire": {*graph["wire"], "gate"}}) != []


def test_each_module_name_is_used_once():
    """A file's name says its job, so no two files of proxy_addon/ (nor a file and a folder) share one."""
    names: dict[str, list[str]] = {}
    for path in sources():
        if path.name not in ("__init__.py", "__main__.py"):
            names.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    for folder in sorted(p for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").exists()):
        if folder != PACKAGE:
            names.setdefault(folder.name, []).append(f"{folder.relative_to(ROOT)}/")
    assert {name: where for name, where in names.items() if len(where) > 1} == {}
