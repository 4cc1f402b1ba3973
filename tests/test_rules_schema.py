"""
The JSON Schema for rules files (proxy_addon/rules.schema.json), which editors use through
the yaml-language-server modeline, and the table of every shipped rules file: it loads,
passes `receipts rules check`, and `receipts rules explain` matches a sample request of
each of its operations to that operation.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import yaml

from proxy_addon import cli
from proxy_addon.errors import RulesError
from proxy_addon.explain import explain, render
from proxy_addon.rules import KEYS, RuleSet, load_rules, load_rules_path
from tests.conftest import ROOT

SCHEMA_PATH = ROOT / "proxy_addon" / "rules.schema.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)
SHIPPED = sorted((ROOT / "rules").glob("*.yaml"))
BAD = sorted((ROOT / "tests" / "rules_bad").glob("*.yaml"))
MODELINE = "# yaml-language-server: $schema=../proxy_addon/rules.schema.json"


def test_the_schema_is_valid_draft_7():
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def _props(*path: str) -> set[str]:
    node = SCHEMA
    for step in path:
        node = node[step]
    return set(node["properties"])


@pytest.mark.parametrize(
    "where, schema_path",
    [
        ("file", ()),
        ("credentials", ("properties", "credentials")),
        ("operation", ("definitions", "operation")),
        ("operation_credentials", ("definitions", "operation", "properties", "credentials")),
        ("match", ("definitions", "operation", "properties", "match")),
        ("fingerprint", ("definitions", "operation", "properties", "fingerprint")),
        ("classify_rule", ("definitions", "operation", "properties", "classify", "oneOf", 1, "items")),
        ("reconcile", ("definitions", "operation", "properties", "reconcile")),
        ("read", ("definitions", "operation", "properties", "reconcile", "properties", "read")),
        ("absent_when", ("definitions", "operation", "properties", "reconcile", "properties", "absent_when")),
        ("idempotency_key", ("definitions", "operation", "properties", "idempotency_key")),
        ("check", ("definitions", "check", "oneOf", 2)),
        ("errors", ("properties", "errors", "oneOf", 1)),
        ("budget", ("definitions", "budget")),
    ],
)
def test_the_schema_names_the_keys_the_loader_accepts(where, schema_path):
    node = SCHEMA
    for step in schema_path:
        node = node[step]
    assert set(node["properties"]) == set(KEYS[where])
    assert node.get("additionalProperties") is False


ENVELOPES = sorted((ROOT / "tests" / "rules_envelopes").glob("*.yaml"))  # errors: each named envelope, a template


@pytest.mark.parametrize(
    "path", [*SHIPPED, ROOT / "tests" / "rules_it" / "test-api.yaml", *ENVELOPES], ids=lambda p: p.name
)
def test_shipped_rules_validate_against_the_schema(path):
    errors = [e.message for e in VALIDATOR.iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_rules_carry_the_modeline_to_the_schema(path):
    first = path.read_text().splitlines()[0]
    assert first == MODELINE
    assert (path.parent / first.split("$schema=")[1]).resolve() == SCHEMA_PATH


def _unknown_key_files():
    for path in BAD:
        try:
            load_rules(path.read_text(), str(path))
        except RulesError as e:
            if "unknown key" in e.message:
                yield path


@pytest.mark.parametrize("path", list(_unknown_key_files()), ids=lambda p: p.name)
def test_the_schema_also_refuses_unknown_keys(path):
    assert not VALIDATOR.is_valid(yaml.safe_load(path.read_text()))


# --- every shipped file, every operation -----------------------------------------------------


def _sample(rf, op, template=None) -> tuple[str, str, bytes, dict[str, str]]:
    """A request the operation matches: at `template` (one of its paths; default its only one)."""
    host = rf.hosts[0].replace("*.", "sample.")
    path = re.sub(r"\{([^{}]*)\}", r"sample-\1", (template or op.path).template)
    body, headers = b"", {}
    if op.graphql:
        body = json.dumps(
            {"query": f"mutation M {{ {op.graphql}(input: {{}}) {{ __typename }} }}", "operationName": "M"}
        ).encode()
        headers = {"content-type": "application/json"}
    if op.mcp_tool:
        arguments = dict(op.mcp_arguments)
        params = {"name": op.mcp_tool if op.mcp_tool != "*" else "sample_tool", "arguments": arguments}
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).encode()
        headers = {"content-type": "application/json"}
    return op.method, f"https://{host}{path}", body, headers


CASES = [(path, op.name) for path in SHIPPED for op in load_rules(path.read_text(), str(path)).operations]


def test_every_shipped_file_passes_rules_check(capsys):
    assert cli.main(["rules", "check", str(ROOT / "rules")]) == 0
    out = capsys.readouterr().out
    for path in SHIPPED:
        assert f"ok  {path}" in out


@pytest.mark.parametrize("path, name", CASES, ids=[f"{p.stem}-{n}" for p, n in CASES])
def test_rules_explain_matches_a_sample_of_each_operation(path, name):
    rules = load_rules_path(ROOT / "rules")  # all files at once: no file shadows another's operation
    rf = next(f for f in rules.files if f.source == str(path))
    op = next(o for o in rf.operations if o.name == name)
    for template in op.path.alternatives or (op.path,):  # each of its paths (match.path: [...])
        method, url, body, headers = _sample(rf, op, template)
        report = explain(rules, method, url, body, headers, b"k" * 32)
        assert report["match"] is not None, report.get("why")
        assert (report["match"]["api"], report["match"]["operation"]) == (rf.api, name)
        assert report["sent"] is False


def test_rules_explain_through_the_cli_names_the_operation_and_redacts_credentials(tmp_path, capsys):
    body = tmp_path / "issue.json"
    body.write_text(json.dumps({"title": "Login fails", "body": "Steps to reproduce", "labels": ["bug"]}))
    rc = cli.main(
        [
            "rules",
            "explain",
            "POST",
            "https://api.github.com/repos/o/r/issues?access_token=tok-SECRET-1",
            "--body",
            str(body),
            "--header",
            "Authorization: Bearer ghp_SECRET-2",
            "--rules",
            str(ROOT / "rules" / "github.yaml"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "operation: github issues.create" in out
    assert 'body.title = "Login fails"' in out and 'path.repo = "r"' in out
    assert "labels" not in out.split("fingerprint fields")[1].split("fingerprint:")[0]  # not allowlisted
    assert "SECRET" not in out
    assert "authorization: REDACTED" in out and "access_token=REDACTED" in out
    assert "Nothing was sent." in out


def test_rules_explain_says_why_nothing_matches(capsys):
    rc = cli.main(
        [
            "rules",
            "explain",
            "POST",
            "https://api.github.com/repos/o/r/labels",
            "--rules",
            str(ROOT / "rules" / "github.yaml"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "no operation of github" in out and "issues.create: POST /repos/{owner}/{repo}/issues: path differs" in out
    assert "passes this request through untouched" in out


def test_rules_check_prints_every_problem_with_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "api: demo\nhosts: [api.demo.test]\noperations:\n"
        "  a.create:\n    match: {method: POST, path: /a}\n    external_id: [id, {x: 1}]\n"
        "  b.create:\n    match: {method: POST, path: /b}\n    classify: [{status: 200, state: maybe}]\n"
        "  c.create:\n    match: {method: POST, path: /c}\n"
    )
    good = tmp_path / "good.yaml"
    good.write_text("api: other\nhosts: [api.other.test]\noperations:\n  x:\n    match: {method: POST, path: /x}\n")
    rc = cli.main(["rules", "check", str(tmp_path)])
    captured = capsys.readouterr()
    assert rc == 1
    assert f"{bad}:6: operations.a.create.external_id[1]: expected a non-empty string" in captured.err
    assert f"{bad}:9: operations.b.create.classify[0].state: 'maybe' is not one of" in captured.err
    assert "2 problems" in captured.err
    assert f"ok  {good}: 1 operations" in captured.out
    assert str(bad) not in captured.out


# --- rules explain shows how a read's list continues (issue 16) --------------------------------


def _read_lines(report) -> list[str]:
    return [d for d in report["duplicates"] if d.startswith("the read's list: ")]


@pytest.mark.parametrize(
    "pack, name, expected",
    [
        (
            "stripe.yaml",
            "payment_intents.create",
            "while has_more is true, the next page asks with data.-1.id as the query parameter starting_after, "
            "at most 5 pages (pages.max)",
        ),
        (
            "github.yaml",
            "pulls.create",
            "follows the answer's Link rel=\"next\" (on the read's own origin), at most 5 pages",
        ),
        (
            "notion.yaml",
            "pages.create",
            "while has_more is true, the next page asks with next_cursor as the body field start_cursor, at most 5 "
            "pages",
        ),
        (
            "dev.to.yaml",
            "articles.create",
            "one page; the rule vouches that it holds every match (complete_in_one_page)",
        ),
        ("github.yaml", "issues.create", "one page (no pages declared); an answer that says there is more"),
    ],
)
def test_rules_explain_shows_how_the_reads_list_continues(pack, name, expected):
    path = ROOT / "rules" / pack
    rules = load_rules_path(ROOT / "rules")
    rf = next(f for f in rules.files if f.source == str(path))
    op = next(o for o in rf.operations if o.name == name)
    report = explain(rules, *_sample(rf, op), b"k" * 32)
    (line,) = _read_lines(report)
    assert expected in line, line
    if "pages.max" in line:
        assert '"not found" counts only when the walk reached the list\'s end' in line
    assert line in render(report)


def test_rules_explain_shows_a_cursor_without_a_more_flag_and_its_max_and_no_list_for_a_read_by_id():
    rules = load_rules_path_text("""
api: t
hosts: [api.t.test]
operations:
  things.create:
    match: {method: POST, path: /things}
    fingerprint: {body: [name]}
    reconcile:
      read: {method: GET, url: "/things?limit=10"}
      items: results
      find: {name: "{intent.name}"}
      pages: {next: {from: next_page_token, param: page_token}, max: 3}
  things.put:
    match: {method: PUT, path: "/things/{id}"}
    reconcile:
      read: {method: GET, url: "/things/{path.id}"}
      absence_provable: true
""")
    (line,) = _read_lines(explain(rules, "POST", "https://api.t.test/things", b"{}", {}, b"k" * 32))
    assert line.startswith(
        "the read's list: while next_page_token has a value, the next page asks with it as "
        "the query parameter page_token, at most 3 pages (pages.max)"
    ), line
    assert _read_lines(explain(rules, "PUT", "https://api.t.test/things/7", b"{}", {}, b"k" * 32)) == []


def load_rules_path_text(text: str) -> RuleSet:
    return RuleSet.of([load_rules(text, "inline.yaml")])


# --- rules explain warns when the fingerprint's fields cannot be applied to the body (issue 14) --

DEV_TO = ROOT / "rules" / "dev.to.yaml"  # fingerprint: {body: [article.title, article.body_markdown]}
FULL = {"article": {"title": "Hello SECRET-T", "body_markdown": "Text SECRET-B"}}

# (case, explain's body arguments, pieces every WARNING line together holds)
UNAPPLIED = [
    (
        "a-form",
        ["--form", "title=Hello+SECRET-T"],
        [
            "named fields (article.title, article.body_markdown) cannot be read from this body "
            "(Content-Type application/x-www-form-urlencoded): it has none of them (read as a form, its fields are: "
            "title)",
            "The intent is the SHA-256 of the whole body instead",
            "a form field is read by its whole name",
            "send JSON with Content-Type: application/json",
        ],
    ),
    (
        "a-form-declared-json",
        ["--body", "title=Hello+SECRET-T&tags=x"],
        [
            "cannot be read from this body (Content-Type application/json): it is not JSON.",
            "the body is form-encoded: send it with Content-Type: application/x-www-form-urlencoded",
        ],
    ),
    (
        "json-of-another-shape",
        ["--body", json.dumps({"title": "Hello SECRET-T", "body_markdown": "SECRET-B"})],
        [
            "it has none of them (read as a JSON object, its fields are: title, body_markdown)",
            'a name in fingerprint.body is a dotted path into the JSON: article.title reads {"article": {"title": …}}',
        ],
    ),
    ("a-json-list", ["--body", json.dumps([FULL])], ["it is JSON but not an object, so it has no fields"]),
    (
        "a-field-missing",
        ["--body", json.dumps({"article": {"title": "Hello SECRET-T"}})],
        ["named fields not in this body: article.body_markdown; each counts as null"],
    ),
]


def _explain(tmp_path, monkeypatch, capsys, body_args: list[str], *more: str) -> str:
    monkeypatch.setenv("RECEIPT_PROXY_STATE_DIR", str(tmp_path / "state"))  # no receipts DB, no key: none looked up
    if body_args[0] == "--body":
        f = tmp_path / "body"
        f.write_text(body_args[1])
        body_args = ["--body", str(f)]
    rc = cli.main(
        ["rules", "explain", "POST", "https://dev.to/api/articles", *body_args, "--rules", str(DEV_TO), *more]
    )
    assert rc == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("case, body_args, says", UNAPPLIED, ids=[c[0] for c in UNAPPLIED])
def test_rules_explain_warns_when_the_named_fields_cannot_be_applied(
    tmp_path, monkeypatch, capsys, case, body_args, says
):
    out = _explain(tmp_path, monkeypatch, capsys, body_args)
    warnings = [line for line in out.splitlines() if line.startswith("  WARNING: ")]
    assert warnings, out
    text = "\n".join(warnings)
    for piece in says:
        assert piece in text
    assert "SECRET" not in text  # names only, never a value
    assert "operation: dev.to articles.create" in out  # it still matched, and still says what it would do
    report = json.loads(_explain(tmp_path, monkeypatch, capsys, body_args, "--json"))
    assert [f"  WARNING: {w}" for w in report["fingerprint"]["warnings"]] == warnings


def test_rules_explain_gives_no_warning_when_the_fields_apply(tmp_path, monkeypatch, capsys):
    out = _explain(tmp_path, monkeypatch, capsys, ["--body", json.dumps(FULL)])
    assert "WARNING" not in out and 'body.article.title = "Hello SECRET-T"' in out
    report = json.loads(_explain(tmp_path, monkeypatch, capsys, ["--body", json.dumps(FULL)], "--json"))
    assert report["fingerprint"]["warnings"] == [] and report["fingerprint"]["notes"] == []
