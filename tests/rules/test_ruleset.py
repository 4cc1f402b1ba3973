"""
Which requests a rule's host and path match, at the edges (issue 24, items 9 and 12), without a proxy
(rules/ruleset.py): the readings of a request target (a fragment, `;` path parameters, `%3B`), a target
that servers read differently refused only when a reading is a write, loopback names as aliases of the
host a rule names, a request matched before keeping its fingerprint (pinned), `rules explain` on a
fragment, and a path template with a `;`. What real servers make of such targets, through a real
mitmdump: tests/e2e/proxy/test_request_target.py.
"""

from __future__ import annotations

import pytest

from proxy_addon.intent.fingerprint import RequestView, fingerprint
from proxy_addon.rules import RuleSet, load_rules

RULES = """\
api: target-api
hosts: [127.0.0.1]
credentials: {header: api-key}
operations:
  things.create:
    match: {method: POST, path: "/api/{bucket}/things"}
    fingerprint: {body: [title]}
    external_id: id
"""


# Fingerprints of requests matched before this change, computed on the code before it (commit
# 248c3c8) with this key: a request to the host its rule names (in any spelling), or with an
# encoded `%3B`, keeps the fingerprint it had, so that no retry across the upgrade is a new write.
KEY = b"0123456789abcdef0123456789abcdef"


BEFORE = "sha256:87390b6d02a06ddf36675f9be1e602862224446e7f03722729bc4a938c322914"


PINNED = {
    ("127.0.0.1", "127.0.0.1", "/api/b/things"): BEFORE,
    ("127.0.0.1", "127.1", "/api/b/things"): BEFORE,
    ("127.0.0.1:8080", "127.0.0.1", "/api/b/things"): BEFORE,
    ('"0x7f000001"', "127.0.0.1", "/api/b/things"): BEFORE,
    (
        "localhost",
        "localhost",
        "/api/b/things",
    ): "sha256:18dfec0d61e480944730f1052f69e1cf15ece4a3800b076b111247f68671dd7c",
    (
        "localhost",
        "LOCALHOST",
        "/api/b/things",
    ): "sha256:18dfec0d61e480944730f1052f69e1cf15ece4a3800b076b111247f68671dd7c",
    ("127.0.0.1", "127.0.0.1", "/api/b%3Bx/things"): (
        "sha256:89a9e943046106ce8806f3afb80c9f5368e1d4655f90d2ab69700cac6a97078e"
    ),
}


def fingerprint_of(rule_host: str, host: str, path: str = "/api/b/things", port: int = 8080) -> str:
    rules = RuleSet.of([load_rules(RULES.replace("[127.0.0.1]", f"[{rule_host}]"), "target.yaml")])
    m = rules.match(host, port, "POST", path)
    assert m is not None, (rule_host, host)
    view = RequestView("POST", "http", host, port, path, {"api-key": "k1"}, b'{"title": "t"}')
    return fingerprint(m, view, KEY).fingerprint


@pytest.mark.parametrize(("rule_host", "host", "path"), list(PINNED))
def test_a_request_matched_before_keeps_its_fingerprint(rule_host, host, path):
    assert fingerprint_of(rule_host, host, path) == PINNED[(rule_host, host, path)]


def test_loopback_aliases_are_one_intent_with_the_host_the_rule_names():
    named = fingerprint_of("127.0.0.1", "127.0.0.1")
    for alias in ("localhost", "LOCALHOST", "localhost.", "::1", "[::1]", "0:0:0:0:0:0:0:1", "0.0.0.0", "::"):
        assert fingerprint_of("127.0.0.1", alias) == named, alias
    assert fingerprint_of("localhost", "127.0.0.1") == fingerprint_of("localhost", "localhost")
    # Other ports, other loopback addresses and other names are not aliases.
    rules = RuleSet.of([load_rules(RULES.replace("[127.0.0.1]", "[127.0.0.1:8080]"), "target.yaml")])
    assert rules.match("localhost", 8080, "POST", "/api/b/things") is not None
    assert rules.match("localhost", 9090, "POST", "/api/b/things") is None
    for other in ("127.0.0.2", "foo.localhost", "::2", "example.com"):
        assert rules.match(other, 8080, "POST", "/api/b/things") is None, other


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/api/b/things", ("/api/b/things",)),
        ("/api/b/things?q=a;b", ("/api/b/things?q=a;b",)),  # a ';' in the query is no path parameter
        ("/api/b/things#x", ("/api/b/things#x", "/api/b/things")),
        ("/api/b/things?q=1#x", ("/api/b/things?q=1#x", "/api/b/things?q=1")),
        ("/api/b;v=1/things;jsessionid=2?q=;", ("/api/b;v=1/things;jsessionid=2?q=;", "/api/b/things?q=;")),
        ("/a/..;/b#f", ("/a/..;/b#f", "/a/..;/b", "/a/../b#f", "/a/../b")),
    ],
)
def test_the_readings_of_a_request_target(path, expected):
    from proxy_addon.wire.canonical import readings

    assert readings(path) == expected


MCP_RULES = (
    RULES
    + """\
  issues.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
"""
)


def test_a_target_servers_read_differently_is_refused_only_when_a_reading_is_a_write():
    rules = RuleSet.of([load_rules(MCP_RULES, "target.yaml")])
    for path in ("/api/b/things#x", "/api/b/things;s=1", "/api/b;s=1/things", "/api/b/x/..;/things#y"):
        m = rules.match("127.0.0.1", 80, "POST", path)
        assert m is not None and m.refused_as == "ambiguous_target", path
    m = rules.match("127.0.0.1", 80, "POST", "/api/b/things#x")
    assert m is not None and m.refused is not None
    assert "a fragment (#…)" in m.refused
    for path in ("/api/b/notes#x", "/elsewhere;s=1", "/api/b/things%3Bs=1"):
        m = rules.match("127.0.0.1", 80, "POST", path)
        assert m is None or m.refused is None, path
    assert rules.match("127.0.0.1", 80, "GET", "/api/b/things#x") is None  # a read either way
    # An MCP endpoint: the body decides, for each reading.
    call = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_issue","arguments":{}}}'
    listing = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
    pending = rules.match("127.0.0.1", 80, "POST", "/mcp#x")
    assert pending is not None and pending.pending and pending.refused
    m = rules.match("127.0.0.1", 80, "POST", "/mcp;s=1", body=call)
    assert m is not None and m.refused_as == "ambiguous_target"
    assert rules.match("127.0.0.1", 80, "POST", "/mcp#x", body=listing) is None


def test_rules_explain_shows_the_refusal_of_a_fragment():
    from proxy_addon.explain import explain, render

    rules = RuleSet.of([load_rules(RULES, "target.yaml")])
    report = explain(
        rules,
        "POST",
        "http://127.0.0.1:8080/api/b/things#x",
        b'{"title": "t"}',
        {"content-type": "application/json"},
        KEY,
    )
    assert report["match"]["operation"] == "things.create" and "a fragment (#…)" in report["refused"]
    assert "fingerprint" not in report
    assert "a fragment" in render(report)


def test_a_path_template_with_a_semicolon_is_refused_and_an_encoded_one_matches():
    from proxy_addon.errors import RulesError

    with pytest.raises(RulesError, match="has a ';'"):
        load_rules(RULES.replace("/api/{bucket}/things", "/api/{bucket}/things;v=1"), "target.yaml")
    rules = RuleSet.of([load_rules(RULES.replace("/api/{bucket}/things", "/api/{bucket}/a%3Bb"), "target.yaml")])
    m = rules.match("127.0.0.1", 80, "POST", "/api/b/a%3bb")
    assert m is not None and m.refused is None
    assert rules.match("127.0.0.1", 80, "POST", "/api/b/a;b") is None  # another path to every server
