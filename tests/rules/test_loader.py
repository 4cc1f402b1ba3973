"""
Tests of the rules loader (proxy_addon/rules.py).

1. Malformed rules files: each file in tests/rules_bad/ is paired below with the line,
   the field and a piece of the message its RulesError must carry.
2. Valid rules: rules/dev.to.yaml, request matching (hosts, ports, wildcards, methods,
   paths), fingerprint defaults and classify ordering.
3. rules_signature: what makes the watcher reload, and what does not.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxy_addon.errors import RulesError
from proxy_addon.rules import (
    FingerprintSpec,
    RuleSet,
    load_rules,
    load_rules_path,
    parse_path_template,
    rules_signature,
)
from proxy_addon.states import State
from tests.conftest import ROOT

DEV_TO = ROOT / "rules" / "dev.to.yaml"
BAD = ROOT / "tests" / "rules_bad"

OP = "operations.items.create"

# --- 1. malformed rules files -------------------------------------------------------------------

# (file name in tests/rules_bad, expected line, expected field, piece of the expected message)
BAD_FILES = [
    # YAML syntax: the line is where the parser saw the problem
    ("01-yaml-extra-brace.yaml", 7, None, "not valid YAML: expected <block end>, but found '}'"),
    ("02-yaml-tab-indent.yaml", 8, None, "found character '\\t' that cannot start any token"),
    ("03-yaml-bad-indent.yaml", 8, None, "not valid YAML: expected <block end>"),
    ("04-yaml-colon-in-value.yaml", 8, None, "mapping values are not allowed here"),
    ("05-yaml-undefined-alias.yaml", 8, None, "YAML aliases (*nope) are not allowed in rules files"),
    ("06-yaml-two-documents.yaml", 6, None, "found another document"),
    # shape of the file
    ("07-empty.yaml", 1, None, "the file is empty; expected keys api, hosts and operations"),
    ("08-comments-only.yaml", 1, None, "the file is empty"),
    # the top level has no field name: the loader uses "" (str() then omits it)
    ("09-top-level-list.yaml", 1, "", "expected a mapping, got a list"),
    ("10-top-level-scalar.yaml", 1, "", "expected a mapping, got str 'just a sentence'"),
    (
        "11-unknown-top-key.yaml",
        5,
        "version",
        "unknown key 'version'; expected one of: api, hosts, credentials, post_reads, method_override, errors, mcp, "
        "decisions, operations",
    ),
    ("12-duplicate-top-key.yaml", 3, "api", "duplicate key"),
    ("13-unknown-operation-key.yaml", 8, f"{OP}.retries", "unknown key 'retries'"),
    ("14-unknown-match-key.yaml", 7, f"{OP}.match.host", "unknown key 'host'; expected one of: method, path, graphql"),
    # api / hosts / credentials
    ("15-missing-api.yaml", 3, "api", "is required"),
    ("16-missing-hosts.yaml", 2, "hosts", "is required"),
    ("17-empty-hosts.yaml", 3, "hosts", "must not be empty"),
    ("18-host-with-scheme.yaml", 5, "hosts", "'https://dev.to' is not a host name"),
    ("19-hosts-int.yaml", 3, "hosts", "expected a list of strings, got int '443'"),
    ("20-host-upper-case.yaml", 3, "hosts", "'API.Demo.test' is not a host name"),
    ("47-api-not-a-string.yaml", 2, "api", "expected a non-empty string, got int '42'"),
    ("48-credentials-bad-header.yaml", 4, "credentials.header", "'api key' is not a valid header name"),
    # operations
    ("21-missing-operations.yaml", 2, "operations", "is required"),
    ("22-empty-operations.yaml", 4, "operations", "must list at least one operation"),
    ("23-duplicate-operation.yaml", 8, OP, "duplicate key"),
    ("24-bad-operation-name.yaml", 5, "operations.items create!", "operation names use letters, digits"),
    ("25-missing-match.yaml", 7, f"{OP}.match", "is required"),
    ("49-match-not-a-mapping.yaml", 7, f"{OP}.match", "expected a mapping, got str 'POST /items'"),
    ("26-missing-method.yaml", 7, f"{OP}.match.method", "is required"),
    ("27-bad-method.yaml", 9, f"{OP}.match.method", "'FETCH' is not one of POST, PUT, PATCH"),
    # path templates
    ("28-path-no-slash.yaml", 7, f"{OP}.match.path", "path template 'items' must start with '/'"),
    ("29-path-unbalanced-brace.yaml", 7, f"{OP}.match.path", "unbalanced '{' or '}' in path template '/items/{id'"),
    ("30-path-duplicate-param.yaml", 7, f"{OP}.match.path", "parameter {id} appears twice"),
    (
        "31-path-bad-param-name.yaml",
        7,
        f"{OP}.match.path",
        "parameter {1x} in path template '/items/{1x}' is not a valid name",
    ),
    ("32-path-with-query.yaml", 7, f"{OP}.match.path", "contains a query or fragment"),
    # fingerprints
    (
        "33-fingerprint-unknown-path-param.yaml",
        10,
        f"{OP}.fingerprint.path",
        "'slug' is not a parameter of '/items/{id}' (it has: id)",
    ),
    ("34-fingerprint-header-authorization.yaml", 8, f"{OP}.fingerprint.headers", "'Authorization' carries credentials"),
    ("35-fingerprint-header-credentials.yaml", 9, f"{OP}.fingerprint.headers", "'x-demo-account' carries credentials"),
    ("36-fingerprint-query-token.yaml", 11, f"{OP}.fingerprint.query", "'token' looks like a credential"),
    ("37-fingerprint-unknown-key.yaml", 8, f"{OP}.fingerprint.params", "unknown key 'params'"),
    ("38-fingerprint-body-number.yaml", 8, f"{OP}.fingerprint.body[1]", "expected a non-empty string, got int '5'"),
    ("39-fingerprint-body-not-dotted.yaml", 8, f"{OP}.fingerprint.body", "'item..title' is not a dotted field path"),
    ("40-fingerprint-body-listed-twice.yaml", 10, f"{OP}.fingerprint.body[1]", "'item.title' is listed twice"),
    # after_success / classify / external_id
    ("41-bad-after-success.yaml", 8, f"{OP}.after_success", "'retry' is not one of replay, block, allow"),
    (
        "42-classify-bad-status.yaml",
        10,
        f"{OP}.classify.4x",
        "'4x' is not a status code (like 409) or class (like 4xx)",
    ),
    ("43-classify-status-600.yaml", 9, f"{OP}.classify.600", "'600' is not a status code"),
    (
        "44-classify-bad-state.yaml",
        9,
        f"{OP}.classify.409",
        "'maybe' is not one of succeeded, rejected, outcome_unknown",
    ),
    (
        "45-classify-unclassifiable-state.yaml",
        9,
        f"{OP}.classify.5xx",
        "'submitted' is not one of succeeded, rejected, outcome_unknown",
    ),
    ("46-external-id-list.yaml", 8, f"{OP}.external_id[1]", "expected a non-empty string, got a mapping"),
    ("95-bad-errors.yaml", 3, "errors", "'openapi' is not one of plain, openai, anthropic, stripe, github"),
    (
        "96-bad-error-template.yaml",
        6,
        "errors.template.error.text",
        "{receipt_id} is not a placeholder of an error template; it may use: {code}, {message}, {status}",
    ),
]

# Files that once crashed the loader or lost the line number (fixed; kept as regressions).
BAD_FILES_BUGS = [
    pytest.param(
        "90-bug-operations-list.yaml",
        4,
        "operations",
        "expected a mapping of operation names, got a list",
        id="90-bug-operations-list",
    ),
    pytest.param(
        "91-bug-operations-scalar.yaml",
        4,
        "operations",
        "expected a mapping of operation names, got str 'items.create'",
        id="91-bug-operations-scalar",
    ),
    pytest.param(
        "92-bug-control-character.yaml",
        3,
        None,
        "unacceptable character #x0007",
        id="92-bug-control-character",
    ),
    pytest.param(
        "93-bug-port-out-of-range.yaml",
        3,
        "hosts",
        "'api.demo.test:99999' is not a host name",
        id="93-bug-port-out-of-range",
    ),
    pytest.param(
        "94-alias-bomb.yaml",
        14,
        None,
        "YAML aliases (*a) are not allowed in rules files",
        id="94-alias-bomb",
    ),
]


def _bad_id(row) -> str:
    return row[0].removesuffix(".yaml")


@pytest.mark.parametrize(("name", "line", "field", "message"), BAD_FILES, ids=[_bad_id(r) for r in BAD_FILES])
def test_malformed_rules_file(name, line, field, message):
    path = BAD / name
    assert path.is_file(), f"missing fixture {path}"
    with pytest.raises(RulesError) as info:
        load_rules_path(path)
    err = info.value
    assert err.source == str(path)
    assert err.line == line
    assert err.field == field
    assert message in err.message
    assert str(err).startswith(f"{path}:{line}: ")
    if field:
        assert str(err) == f"{path}:{line}: {field}: {err.message}"
    else:
        assert str(err) == f"{path}:{line}: {err.message}"


@pytest.mark.parametrize(("name", "line", "field", "message"), BAD_FILES_BUGS)
def test_malformed_rules_file_known_bugs(name, line, field, message):
    path = BAD / name
    assert path.is_file(), f"missing fixture {path}"
    with pytest.raises(RulesError) as info:
        load_rules_path(path)
    err = info.value
    assert err.line == line
    assert err.field == field
    assert message in err.message
    assert "\n" not in str(err)
    assert str(err).startswith(f"{path}:{line}: ")


def test_every_bad_file_is_in_a_table():
    """No fixture without expectations, no expectation without a fixture."""
    listed = {r[0] for r in BAD_FILES} | {p.values[0] for p in BAD_FILES_BUGS}
    on_disk = {p.name for p in BAD.iterdir()}
    assert on_disk == listed
    assert len(BAD_FILES) >= 20


def test_load_rules_without_a_source_names_the_default():
    with pytest.raises(RulesError) as info:
        load_rules("api: demo\n")
    assert info.value.source == "<rules>"
    assert info.value.field == "hosts"
    assert str(info.value) == "<rules>:1: hosts: is required"


def test_folder_with_two_files_for_the_same_api_names_the_second(tmp_path):
    text = "api: demo\nhosts: [{host}]\noperations:\n  items.create: {{match: {{method: POST, path: /items}}}}\n"
    (tmp_path / "a.yaml").write_text(text.format(host="a.demo.test"))
    (tmp_path / "b.yaml").write_text(text.format(host="b.demo.test"))
    with pytest.raises(RulesError) as info:
        load_rules_path(tmp_path)
    err = info.value
    assert err.source == str(tmp_path / "b.yaml")
    assert err.field == "api"
    assert err.line is None
    assert err.message == f"api 'demo' is already defined in {tmp_path / 'a.yaml'}"
    assert str(err).startswith(f"{tmp_path / 'b.yaml'}: api: ")


def test_folder_error_names_the_bad_file_not_the_folder(tmp_path):
    (tmp_path / "a.yaml").write_text(DEV_TO.read_text())
    (tmp_path / "b.yaml").write_text("api: other\nhosts: []\noperations: {}\n")
    with pytest.raises(RulesError) as info:
        load_rules_path(tmp_path)
    assert info.value.source == str(tmp_path / "b.yaml")
    assert (info.value.line, info.value.field) == (2, "hosts")


@pytest.mark.parametrize("extra", [None, "notes.txt", "rules.yaml.bak", "README.md"], ids=["empty", "txt", "bak", "md"])
def test_folder_without_yaml_files_fails(tmp_path, extra):
    if extra:
        (tmp_path / extra).write_text(DEV_TO.read_text())
    with pytest.raises(RulesError) as info:
        load_rules_path(tmp_path)
    err = info.value
    assert err.source == str(tmp_path)
    assert (err.line, err.field) == (None, None)
    assert "no *.yaml rules files in this folder" in err.message
    assert str(err).startswith(str(tmp_path))


def test_missing_path_fails(tmp_path):
    missing = tmp_path / "nope" / "dev.to.yaml"
    with pytest.raises(RulesError) as info:
        load_rules_path(missing)
    err = info.value
    assert err.source == str(missing)
    assert err.message == "no such rules file or folder"
    assert str(err) == f"{missing}: no such rules file or folder"


def test_file_that_is_not_utf8_fails(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes("api: d\xe9mo\n".encode("latin-1"))
    with pytest.raises(RulesError) as info:
        load_rules_path(f)
    assert info.value.source == str(f)
    assert info.value.message.startswith("cannot read:")


# --- every problem in one run (issue 14) ---------------------------------------------------------

# A top-level mistake, one operation with seven independent mistakes, another with two, and a good
# one: (line, field, piece of the message), in line order. Before, `rules check` stopped at the
# top level's problem ("1 problem"); without it, it gave the first of each operation.
MANY_MISTAKES = """\
api: blog
hosts: [api.blog.test, 'Bad.Host']
credentials: {header: api-key}
operations:
  posts.create:
    match: {method: POST, path: '/posts/{id'}
    fingerprint: {body: [title, 'bad field'], headers: [api-key]}
    extrnal_id: id
    classify: {409: maybe, 4xx: rejected}
    reconcile:
      read: {url: '/posts?title={intent.title'}
      find: {title: '{intent.title}'}
      settle: 5m
  posts.update:
    match: {method: PUTT, path: '/posts/{id}'}
    fingerprint: {path: [slug]}
  posts.ok:
    match: {method: POST, path: /ok}
"""
MANY_PROBLEMS = [
    (2, "hosts", "'Bad.Host' is not a host name"),
    (6, "operations.posts.create.match.path", "unbalanced '{' or '}' in path template '/posts/{id'"),
    (7, "operations.posts.create.fingerprint.body", "'bad field' is not a dotted field path"),
    (7, "operations.posts.create.fingerprint.headers", "'api-key' carries credentials"),
    (8, "operations.posts.create.extrnal_id", "unknown key 'extrnal_id'"),
    (9, "operations.posts.create.classify.409", "'maybe' is not one of"),
    (
        11,
        "operations.posts.create.reconcile.read.url",
        "unbalanced '{' or '}' in template '/posts?title={intent.title'",
    ),
    (13, "operations.posts.create.reconcile.settle", "needs absence_provable: true"),
    (15, "operations.posts.update.match.method", "'PUTT' is not one of"),
    (16, "operations.posts.update.fingerprint.path", "'slug' is not a parameter of '/posts/{id}'"),
]


def test_rules_check_reports_every_problem_of_every_operation_in_one_run(tmp_path, capsys):
    from proxy_addon.cli import main

    f = tmp_path / "blog.yaml"
    f.write_text(MANY_MISTAKES)
    assert main(["rules", "check", str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    expected = [f"{f}:{line}: {field}: " for line, field, _ in MANY_PROBLEMS]
    assert [e[: len(x)] for e, x in zip(err, expected, strict=False)] == expected, "\n".join(err)
    for got, (_, _, message) in zip(err, MANY_PROBLEMS, strict=False):
        assert message in got
    assert err[len(MANY_PROBLEMS) :] == [f"{len(MANY_PROBLEMS)} problems"]  # the count agrees with the lines
    # The proxy (load_rules_path) refuses the file with the first problem it meets.
    with pytest.raises(RulesError) as info:
        load_rules_path(f)
    assert str(info.value).startswith(f"{f}:2: hosts: ")


def test_a_problem_does_not_hide_one_that_follows_it_in_the_same_part(tmp_path):
    """A misspelt key and the required one it misses; two bad items of one list, and the next list."""
    from proxy_addon.rules import check_rules

    text = """\
api: blog
hosts: [api.blog.test]
operations:
  posts.create:
    mtach: {method: POST, path: /posts}
    fingerprint: {body: [a b, c d], query: [token]}
"""
    problems = [(p.line, p.field, p.message) for p in check_rules(text, "blog.yaml")]
    assert problems == [
        (
            5,
            "operations.posts.create.mtach",
            "unknown key 'mtach'; expected one of: description, match, credentials, fingerprint, "
            "external_id, after_success, classify, reconcile, idempotency_key, approve, record, decisions, budget",
        ),
        (5, "operations.posts.create.match", "is required"),
        (6, "operations.posts.create.fingerprint.body", "'a b' is not a dotted field path like 'article.title'"),
        (6, "operations.posts.create.fingerprint.body", "'c d' is not a dotted field path like 'article.title'"),
        (
            6,
            "operations.posts.create.fingerprint.query",
            "'token' looks like a credential; secrets never enter a fingerprint",
        ),
    ]


def test_what_depends_on_a_part_with_a_problem_is_not_checked_against_it():
    """A path that does not parse leaves the fingerprint's path parameters unchecked; a fingerprint
    with a problem leaves the names reconcile templates use unchecked: one problem each, no echo."""
    from proxy_addon.rules import check_rules

    text = """\
api: blog
hosts: [api.blog.test]
operations:
  posts.update:
    match: {method: PUT, path: '/posts/{id'}
    fingerprint: {path: [id], body: [title, 'x y']}
    reconcile:
      read: {url: '/posts/{path.id}?t={intent.title}'}
"""
    assert [(p.line, p.field) for p in check_rules(text, "blog.yaml")] == [
        (5, "operations.posts.update.match.path"),
        (6, "operations.posts.update.fingerprint.body"),
    ]
    # With the fingerprint fixed, a template naming what it does not record is reported again.
    fixed = (
        text.replace("'/posts/{id'", "'/posts/{id}'").replace(", 'x y'", "").replace("{intent.title}", "{intent.body}")
    )
    assert [(p.line, p.field, p.message.split(";")[0]) for p in check_rules(fixed, "blog.yaml")] == [
        (
            8,
            "operations.posts.update.reconcile.read.url",
            "{intent.body} is not recorded by this operation's fingerprint",
        ),
    ]


# --- parse_path_template ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "params", "path", "expected"),
    [
        ("/api/articles", (), "/api/articles", {}),
        ("/api/articles", (), "/api/articles/", {}),  # a trailing slash is the same route
        ("/api/articles/{id}", ("id",), "/api/articles/42", {"id": "42"}),
        ("/api/articles/{id}", ("id",), "/api/articles/", None),
        ("/api/articles/{id}", ("id",), "/api/articles/42/extra", None),
        (
            "/orgs/{org}/repos/{repo_name}",
            ("org", "repo_name"),
            "/orgs/acme/repos/web",
            {"org": "acme", "repo_name": "web"},
        ),
        ("/v1.0/items+{id}", ("id",), "/v1.0/items+7", {"id": "7"}),  # '.' and '+' are literal
        ("/v1.0/items+{id}", ("id",), "/v1x0/items+7", None),
        ("/files/{name}.json", ("name",), "/files/report.json", {"name": "report"}),
    ],
    ids=[
        "literal",
        "literal-trailing-slash",
        "param",
        "param-empty",
        "param-extra-segment",
        "two-params",
        "regex-chars-literal",
        "regex-dot-not-wildcard",
        "param-with-suffix",
    ],
)
def test_parse_path_template(template, params, path, expected):
    t = parse_path_template(template)
    assert t.template == template
    assert t.params == params
    assert t.match(path) == expected


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("api/articles", "must start with '/'"),
        ("", "must start with '/'"),
        ("/api/{id", "unbalanced"),
        ("/api/id}", "unbalanced"),
        ("/api/{{id}}", "unbalanced"),
        ("/api/{id}/{id}", "appears twice"),
        ("/api/{1x}", "{1x}"),
        ("/api/{}", "is not a valid name"),
        ("/api/{a-b}", "is not a valid name"),
        ("/api?x=1", "query or fragment"),
        ("/api#top", "query or fragment"),
    ],
    ids=[
        "no-slash",
        "empty",
        "open-brace",
        "close-brace",
        "double-brace",
        "dup-param",
        "digit-param",
        "empty-param",
        "dash-param",
        "query",
        "fragment",
    ],
)
def test_parse_path_template_rejects(template, message):
    with pytest.raises(ValueError) as info:
        parse_path_template(template)
    assert message in str(info.value)


# --- 2. valid rules ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def devto() -> RuleSet:
    return load_rules_path(DEV_TO)


def test_dev_to_rules_load(devto):
    assert len(devto.files) == 1
    f = devto.files[0]
    assert (f.api, f.hosts, f.source) == ("dev.to", ("dev.to",), str(DEV_TO))
    assert [op.name for op in devto.operations] == ["articles.create", "articles.update"]

    create = devto.operation("dev.to", "articles.create")
    assert (create.api, create.method, create.path.template, create.path.params) == (
        "dev.to",
        "POST",
        "/api/articles",
        (),
    )
    assert create.fingerprint == FingerprintSpec(path=(), body=("article.title", "article.body_markdown"))
    assert create.external_id == "id"
    assert create.after_success == "replay"
    assert create.classify == ()
    assert create.credential_headers == ("api-key",)
    assert create.source == str(DEV_TO)

    update = devto.operation("dev.to", "articles.update")
    assert (update.method, update.path.template, update.path.params) == ("PUT", "/api/articles/{id}", ("id",))
    assert update.fingerprint == FingerprintSpec(
        path=("id",), body=("article.title", "article.body_markdown", "article.published")
    )
    assert update.classify == ()  # an unruled 409 is already_exists by default (issue 16)
    assert update.after_success == "replay"


def test_rules_folder_loads_the_same_as_the_file(devto):
    folder = load_rules_path(DEV_TO.parent)
    assert tuple(op for op in folder.operations if op.api == "dev.to") == devto.operations


def test_operation_lookup_misses(devto):
    assert devto.operation("dev.to", "articles.delete") is None
    assert devto.operation("github", "articles.create") is None
    assert RuleSet().operation("dev.to", "articles.create") is None
    assert RuleSet().match("dev.to", 443, "POST", "/api/articles") is None


@pytest.mark.parametrize(
    ("host", "port", "method", "path", "expected"),
    [
        ("dev.to", 443, "POST", "/api/articles", ("articles.create", {})),
        ("dev.to", 443, "POST", "/api/articles?draft=true&api-key=x", ("articles.create", {})),
        ("dev.to", 443, "POST", "/api/articles?", ("articles.create", {})),
        ("dev.to", 80, "POST", "/api/articles", ("articles.create", {})),  # no port in the rule: any port
        ("DEV.TO", 443, "POST", "/api/articles", ("articles.create", {})),
        ("dev.to.", 443, "POST", "/api/articles", ("articles.create", {})),
        ("dev.to", 443, "PUT", "/api/articles/42", ("articles.update", {"id": "42"})),
        ("dev.to", 443, "PUT", "/api/articles/42?x=1/2", ("articles.update", {"id": "42"})),
        ("dev.to", 443, "PUT", "/api/articles/my-post-1a2b", ("articles.update", {"id": "my-post-1a2b"})),
        ("dev.to", 443, "GET", "/api/articles", None),
        ("dev.to", 443, "DELETE", "/api/articles/42", None),
        ("dev.to", 443, "POST", "/api/articles/42", None),
        ("dev.to", 443, "PUT", "/api/articles", None),
        ("dev.to", 443, "PUT", "/api/articles/42/extra", None),
        ("dev.to", 443, "PUT", "/api/articles/42/", ("articles.update", {"id": "42"})),
        ("dev.to", 443, "PUT", "/api/articles/", None),
        ("dev.to", 443, "POST", "/api/articles/", ("articles.create", {})),
        ("dev.to", 443, "POST", "/api/articlesX", None),
        ("dev.to", 443, "POST", "/API/articles", None),
        ("dev.to", 443, "POST", "/v2/api/articles", None),
        ("example.com", 443, "POST", "/api/articles", None),
        ("api.dev.to", 443, "POST", "/api/articles", None),
        ("xdev.to", 443, "POST", "/api/articles", None),
    ],
    ids=[
        "create",
        "create-query-ignored",
        "create-empty-query",
        "any-port",
        "host-case",
        "host-trailing-dot",
        "update",
        "update-query-with-slash",
        "update-slug",
        "wrong-method-get",
        "wrong-method-delete",
        "create-method-on-update-path",
        "update-method-on-create-path",
        "extra-segment",
        "update-trailing-slash",
        "empty-param",
        "create-trailing-slash",
        "suffix-on-literal",
        "path-case",
        "prefix",
        "unknown-host",
        "subdomain-of-exact-host",
        "host-suffix-without-dot",
    ],
)
def test_dev_to_match(devto, host, port, method, path, expected):
    m = devto.match(host, port, method, path)
    if expected is None:
        assert m is None
    else:
        assert m is not None
        assert (m.operation.name, m.params) == expected
        assert m.operation.api == "dev.to"


HOSTS_RULES = """\
api: hosts
hosts: ["*.example.com", "127.0.0.1:8443", "*.ports.test:9000", "plain.test"]
operations:
  things.create:
    match: {method: POST, path: /things}
"""


@pytest.fixture(scope="module")
def hosts_rules() -> RuleSet:
    return RuleSet.of([load_rules(HOSTS_RULES, "hosts.yaml")])


@pytest.mark.parametrize(
    ("host", "port", "matches"),
    [
        ("api.example.com", 443, True),
        ("API.Example.COM", 443, True),
        ("a.b.example.com", 443, True),  # '*.' covers every depth of subdomain
        ("api.example.com", 8080, True),  # no port in the rule: any port
        ("example.com", 443, False),  # the bare domain is not a subdomain
        ("badexample.com", 443, False),
        ("example.com.evil.test", 443, False),
        ("api.example.org", 443, False),
        ("127.0.0.1", 8443, True),  # host:port matches that port only
        ("127.0.0.1", 443, False),
        ("127.0.0.1", 844, False),
        ("127.0.0.1", 18443, False),
        ("127.0.0.2", 8443, False),
        ("x.ports.test", 9000, True),  # wildcard with a port
        ("x.ports.test", 900, False),
        ("x.ports.test", 19000, False),
        ("x.ports.test", 443, False),
        ("ports.test", 9000, False),
        ("plain.test", 1234, True),
        ("www.plain.test", 443, False),
    ],
    ids=[
        "wildcard",
        "wildcard-case",
        "wildcard-deep",
        "wildcard-any-port",
        "wildcard-bare-domain",
        "wildcard-no-dot",
        "wildcard-suffix-elsewhere",
        "wildcard-other-tld",
        "port-exact",
        "port-other",
        "port-prefix",
        "port-longer",
        "port-other-ip",
        "wildcard-port",
        "wildcard-port-prefix",
        "wildcard-port-longer",
        "wildcard-port-other",
        "wildcard-port-bare",
        "exact-any-port",
        "exact-subdomain",
    ],
)
def test_host_matching(hosts_rules, host, port, matches):
    m = hosts_rules.match(host, port, "POST", "/things")
    assert (m is not None) == matches
    if matches:
        assert m.operation.name == "things.create"
        assert hosts_rules.match(host, port, "PUT", "/things") is None


def test_errors_names_the_envelope_of_every_operation_of_the_file():
    """`errors:` (a file's key) reaches each operation; without it, plain (the proxy's own JSON)."""
    text = """\
api: env
hosts: [env.test]
errors: {errors}
operations:
  a.create:
    match: {{method: POST, path: /a}}
  b.create:
    match: {{method: POST, path: /b}}
"""
    for errors in ("openai", "anthropic", "stripe", "github", "plain"):
        rf = load_rules(text.format(errors=errors), "env.yaml")
        assert [op.errors for op in rf.operations] == [errors, errors]
    plain = load_rules(text.replace("errors: {errors}\n", "").format(), "env.yaml")
    assert [op.errors for op in plain.operations] == ["plain", "plain"]


def test_first_operation_in_file_order_wins():
    text = """\
api: order
hosts: [order.test]
operations:
  items.update:
    match: {method: POST, path: "/items/{id}"}
  items.special:
    match: {method: POST, path: /items/special}
  items.other:
    match: {method: POST, path: /items/other}
"""
    rules = RuleSet.of([load_rules(text, "order.yaml")])
    m = rules.match("order.test", 443, "POST", "/items/special")
    assert m is not None
    assert (m.operation.name, m.params) == ("items.update", {"id": "special"})
    assert [op.name for op in rules.operations] == ["items.update", "items.special", "items.other"]


def test_an_operation_with_several_paths_matches_at_each_and_fingerprints_the_parameters_they_share():
    text = """\
api: mcp
hosts: [mcp.test]
operations:
  issue.create:
    match: {method: POST, path: [/mcp/, "/mcp/x/{toolset}", "/v{n}/tools/{toolset}"]}
    fingerprint: {body: [title]}
  note.create:
    match: {method: POST, path: ["/notes/{id}", "/v2/notes/{id}"]}
"""
    rules = RuleSet.of([load_rules(text, "mcp.yaml")])
    found = {p: rules.match("mcp.test", 443, "POST", p) for p in ("/mcp", "/mcp/", "/mcp/x/issues", "/v1/tools/all")}
    assert None not in found.values()
    assert {p: (m.operation.name, m.params) for p, m in found.items() if m is not None} == {
        "/mcp": ("issue.create", {}),
        "/mcp/": ("issue.create", {}),
        "/mcp/x/issues": ("issue.create", {"toolset": "issues"}),
        "/v1/tools/all": ("issue.create", {"n": "1", "toolset": "all"}),
    }
    assert rules.match("mcp.test", 443, "POST", "/mcp/y/issues") is None
    issue, note = rules.operations
    assert issue.path.params == () and issue.fingerprint.path == ()  # no parameter is in every path
    assert note.path.params == ("id",) and note.fingerprint.path == ("id",)
    m = rules.match("mcp.test", 443, "POST", "/v2/notes/7")
    assert m is not None and m.params == {"id": "7"}
    assert issue.path.template == "/mcp/ | /mcp/x/{toolset} | /v{n}/tools/{toolset}"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (
            '[/a, "/b/{id}"], fingerprint: {path: [id]}',
            "'id' is not a parameter of '/a | /b/{id}' in each of its paths",
        ),
        ("[]", "must not be empty"),
        ("[/a, /a]", "operations.x.match.path[1]: '/a' is listed twice"),
        ('[/a, "/b/{id"]', "operations.x.match.path[1]: unbalanced"),
    ],
)
def test_a_list_of_paths_is_checked_item_by_item(path, message):
    fingerprint = ""
    if ", fingerprint:" in path:
        path, fingerprint = path.split(", fingerprint: ")
        fingerprint = f"\n    fingerprint: {fingerprint}"
    text = f"api: x\nhosts: [x.test]\noperations:\n  x:\n    match: {{method: POST, path: {path}}}{fingerprint}\n"
    with pytest.raises(RulesError, match=message.replace("[", r"\[").replace("]", r"\]").replace("|", r"\|")):
        load_rules(text, "x.yaml")


def test_two_files_match_independently(tmp_path):
    (tmp_path / "a.yaml").write_text(DEV_TO.read_text())
    (tmp_path / "b.yml").write_text(HOSTS_RULES)  # .yml is read too
    (tmp_path / "c.txt").write_text("not rules")
    rules = load_rules_path(tmp_path)
    assert [f.api for f in rules.files] == ["dev.to", "hosts"]
    assert [f.source for f in rules.files] == [str(tmp_path / "a.yaml"), str(tmp_path / "b.yml")]
    m = rules.match("dev.to", 443, "POST", "/api/articles")
    assert m is not None and m.operation.api == "dev.to"
    m = rules.match("a.example.com", 443, "POST", "/things")
    assert m is not None and m.operation.api == "hosts"
    assert rules.match("dev.to", 443, "POST", "/things") is None
    op = rules.operation("hosts", "things.create")
    assert op is not None and op.path.template == "/things"


def _op(fingerprint_yaml: str | None, path: str = "/orgs/{org}/items/{id}", extra: str = ""):
    text = (
        "api: fp\nhosts: [fp.test]\ncredentials: {header: [X-Api-Key, X-Account]}\noperations:\n"
        f"  items.update:\n    match: {{method: put, path: '{path}'}}\n"
    )
    if fingerprint_yaml is not None:
        text += f"    fingerprint: {fingerprint_yaml}\n"
    text += extra
    return load_rules(text, "fp.yaml").operations[0]


@pytest.mark.parametrize(
    ("fingerprint", "expected"),
    [
        (None, FingerprintSpec(path=("org", "id"), body=None)),
        ("{}", FingerprintSpec(path=("org", "id"), body=None)),
        ("{body: []}", FingerprintSpec(path=("org", "id"), body=())),
        ("{path: []}", FingerprintSpec(path=(), body=None)),
        ("{path: [id]}", FingerprintSpec(path=("id",), body=None)),
        ("{path: id, body: item.title}", FingerprintSpec(path=("id",), body=("item.title",))),
        ("{body: [item.title, item.tags]}", FingerprintSpec(path=("org", "id"), body=("item.title", "item.tags"))),
        ("{query: [page, fields]}", FingerprintSpec(path=("org", "id"), body=None, query=("page", "fields"))),
        ("{headers: [X-Request-Kind]}", FingerprintSpec(path=("org", "id"), body=None, headers=("x-request-kind",))),
    ],
    ids=[
        "absent",
        "empty-mapping",
        "body-empty-list",
        "path-empty-list",
        "path-subset",
        "scalars",
        "body-fields",
        "query",
        "headers-lowercased",
    ],
)
def test_fingerprint_defaults(fingerprint, expected):
    op = _op(fingerprint)
    assert op.fingerprint == expected


def test_operation_defaults_and_normalisation():
    op = _op(None)
    assert op.method == "PUT"  # "put" in the file
    assert op.credential_headers == ("x-api-key", "x-account")
    assert op.external_id is None
    assert op.after_success == "replay"
    assert op.classify == ()
    assert op.source == "fp.yaml"


@pytest.mark.parametrize(
    "header", ["X-Api-Key", "x-account", "Cookie", "Proxy-Authorization", "X-Auth-Token", "X-Session-Id"]
)
def test_secret_headers_never_enter_a_fingerprint(header):
    with pytest.raises(RulesError) as info:
        _op(f"{{headers: [{header}]}}")
    assert info.value.field == "operations.items.update.fingerprint.headers"
    assert info.value.line == 7
    assert f"{header!r} carries credentials" in info.value.message


@pytest.mark.parametrize(
    "query", ["access_token", "api_key", "Signature", "sig", "key", "code", "password", "client_secret"]
)
def test_secret_query_params_never_enter_a_fingerprint(query):
    with pytest.raises(RulesError) as info:
        _op(f"{{query: [{query}]}}")
    assert info.value.field == "operations.items.update.fingerprint.query"
    assert f"{query!r} looks like a credential" in info.value.message


@pytest.mark.parametrize("query", ["page", "keyword", "monkey", "barcode", "per_page"])
def test_ordinary_query_params_are_allowed(query):
    assert _op(f"{{query: [{query}]}}").fingerprint.query == (query,)


@pytest.mark.parametrize(
    ("classify", "expected"),
    [
        ("{4xx: rejected, 409: outcome_unknown}", (("409", State.OUTCOME_UNKNOWN), ("4xx", State.REJECTED))),
        (
            "{5XX: outcome_unknown, 4xx: rejected, 429: outcome_unknown, 404: succeeded, 2xx: succeeded}",
            (
                ("429", State.OUTCOME_UNKNOWN),
                ("404", State.SUCCEEDED),
                ("5xx", State.OUTCOME_UNKNOWN),
                ("4xx", State.REJECTED),
                ("2xx", State.SUCCEEDED),
            ),
        ),
        ("{409: rejected}", (("409", State.REJECTED),)),
        ("{'409': rejected}", (("409", State.REJECTED),)),
        ("{}", ()),
    ],
    ids=["class-then-code", "mixed-keeps-file-order-within-kind", "int-key", "string-key", "empty"],
)
def test_classify_exact_codes_before_classes(classify, expected):
    op = _op(None, extra=f"    classify: {classify}\n")
    assert op.classify == expected
    assert all(isinstance(state, State) for _, state in op.classify)


@pytest.mark.parametrize("policy", ["replay", "block", "allow"])
def test_after_success_values(policy):
    assert _op(None, extra=f"    after_success: {policy}\n").after_success == policy


@pytest.mark.parametrize("external_id", ["id", "data.id", "result.items.0.uuid"])
def test_external_id_dotted_paths(external_id):
    assert _op(None, extra=f"    external_id: {external_id}\n").external_id == external_id


# --- 3. rules_signature --------------------------------------------------------------------------


@pytest.fixture
def rules_dir(tmp_path):
    d = tmp_path / "rules"
    d.mkdir()
    (d / "dev.to.yaml").write_text(DEV_TO.read_text())
    (d / "hosts.yaml").write_text(HOSTS_RULES)
    return d


def test_signature_is_stable_when_nothing_changes(rules_dir):
    first = rules_signature(rules_dir)
    assert first == rules_signature(rules_dir)
    assert [Path(name).name for name, _, _ in first] == ["dev.to.yaml", "hosts.yaml"]
    assert first[0][2] == len(DEV_TO.read_bytes())
    load_rules_path(rules_dir)  # reading does not count as a change
    assert rules_signature(rules_dir) == first


def test_signature_ignores_other_files(rules_dir):
    before = rules_signature(rules_dir)
    (rules_dir / "notes.txt").write_text("x")
    (rules_dir / "dev.to.yaml.bak").write_text("x")
    (rules_dir / "sub").mkdir()
    assert rules_signature(rules_dir) == before


def test_signature_changes_when_a_file_is_edited(rules_dir):
    before = rules_signature(rules_dir)
    f = rules_dir / "hosts.yaml"
    f.write_text(HOSTS_RULES + "# edited\n")
    assert rules_signature(rules_dir) != before


def test_signature_changes_when_only_the_mtime_changes(rules_dir):
    f = rules_dir / "hosts.yaml"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns - 1_000_000_000))
    before = rules_signature(rules_dir)
    f.write_text(HOSTS_RULES.replace("things", "THINGS"))  # same size, new mtime
    assert f.stat().st_size == st.st_size
    assert rules_signature(rules_dir) != before


@pytest.mark.parametrize("name", ["new.yaml", "new.yml"])
def test_signature_changes_when_a_file_is_added(rules_dir, name):
    before = rules_signature(rules_dir)
    (rules_dir / name).write_text(HOSTS_RULES)
    after = rules_signature(rules_dir)
    assert after != before
    assert len(after) == len(before) + 1


def test_signature_changes_when_a_file_is_removed(rules_dir):
    before = rules_signature(rules_dir)
    (rules_dir / "hosts.yaml").unlink()
    after = rules_signature(rules_dir)
    assert after != before
    assert [Path(name).name for name, _, _ in after] == ["dev.to.yaml"]


def test_signature_of_a_single_file(rules_dir):
    f = rules_dir / "dev.to.yaml"
    sig = rules_signature(f)
    assert sig == ((str(f), f.stat().st_mtime_ns, f.stat().st_size),)
    (rules_dir / "hosts.yaml").write_text("changed")  # a sibling does not count
    assert rules_signature(f) == sig
    f.write_text(DEV_TO.read_text() + "\n")
    assert rules_signature(f) != sig


def test_signature_of_a_missing_path_is_empty(tmp_path):
    assert rules_signature(tmp_path / "nope") == ()
