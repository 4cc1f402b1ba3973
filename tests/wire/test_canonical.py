"""
Canonical request targets (proxy_addon/wire/canonical.py), unit by unit: every normalisation, what
must NOT be merged, and how matching (RuleSet.match), path templates, allow_hosts patterns,
the fingerprint and `rules explain` use them. The same requests through a real proxy are in
tests/e2e/proxy/test_canonical_requests.py; the property over random spellings in
tests/intent/test_fingerprint_same_write.py.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy_addon.errors import RulesError
from proxy_addon.explain import explain, render
from proxy_addon.intent.fingerprint import RequestView, build_attempt, fingerprint, intent_notes
from proxy_addon.rules import RuleSet, host_pattern, load_rules, parse_path_template
from proxy_addon.wire.canonical import (
    ConflictingOverrides,
    canonical_host,
    canonical_path,
    effective_method,
    ip_literal,
    method_overrides,
    param_value,
    target,
)

KEY = b"k" * 32

# --- hosts -----------------------------------------------------------------------------------

HOSTS = [
    # id, as sent, canonical
    ("dotted", "127.0.0.1", "127.0.0.1"),
    ("two-parts", "127.1", "127.0.0.1"),
    ("three-parts", "127.0.1", "127.0.0.1"),
    ("decimal", "2130706433", "127.0.0.1"),
    ("hex", "0x7f000001", "127.0.0.1"),
    ("hex-upper", "0X7F000001", "127.0.0.1"),
    ("hex-padded", "0x007f000001", "127.0.0.1"),
    ("octal-first", "0177.0.0.1", "127.0.0.1"),
    ("octal-all", "0177.00.00.01", "127.0.0.1"),
    ("octal-whole", "017700000001", "127.0.0.1"),
    ("mixed-bases", "0x7f.0.0x0.01", "127.0.0.1"),
    ("trailing-dot", "127.0.0.1.", "127.0.0.1"),
    ("alias-trailing-dot", "127.1.", "127.0.0.1"),
    ("v4-mapped-v6", "::ffff:127.0.0.1", "127.0.0.1"),
    ("v4-mapped-v6-bracketed", "[::ffff:127.0.0.1]", "127.0.0.1"),
    ("v4-mapped-v6-hex", "::FFFF:7f00:1", "127.0.0.1"),
    ("v4-mapped-v6-long", "0:0:0:0:0:ffff:7f00:0001", "127.0.0.1"),
    ("v6-loopback-long", "0:0:0:0:0:0:0:1", "::1"),
    ("v6-bracketed", "[::1]", "::1"),
    ("v6-bracketed-trailing-dot", "[::1].", "::1"),  # the dot taken off before the brackets: a fixed point
    ("v6-upper-uncompressed", "2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
    ("v6-leading-zeros", "2001:0db8:0000::0001", "2001:db8::1"),
    ("name-case", "API.Example.COM", "api.example.com"),
    ("name-trailing-dot", "api.example.com.", "api.example.com"),
    # not IP addresses: names, kept (lower-cased), never merged with an address
    ("octet-too-big", "256.1.1.1", "256.1.1.1"),
    ("five-parts", "1.2.3.4.5", "1.2.3.4.5"),
    ("too-big-for-32-bits", "4294967296", "4294967296"),
    ("not-hex", "0x7g000001", "0x7g000001"),
    ("not-octal", "08.0.0.1", "08.0.0.1"),
    ("empty-part", "127..1", "127..1"),
    ("name-with-digits", "127.0.0.1a", "127.0.0.1a"),
    ("numeric-label-name", "1e100.net", "1e100.net"),
]


@pytest.mark.parametrize("sent, canonical", [h[1:] for h in HOSTS], ids=[h[0] for h in HOSTS])
def test_canonical_host(sent, canonical):
    assert canonical_host(sent) == canonical
    assert canonical_host(canonical) == canonical  # idempotent


@pytest.mark.parametrize(
    "host, ip",
    [
        ("127.1", "127.0.0.1"),
        ("[::ffff:127.0.0.1]", "127.0.0.1"),
        ("[::1]", "::1"),
        ("api.test", None),
        ("256.0.0.1", None),
    ],
)
def test_ip_literal(host, ip):
    assert ip_literal(host) == ip


# --- paths -----------------------------------------------------------------------------------

PATHS = [
    # id, as sent, canonical
    ("already-canonical", "/api/b/things", "/api/b/things"),
    ("encoded-letter", "/api/b/thing%73", "/api/b/things"),
    ("encoded-upper-letter", "/api/b/%54hings", "/api/b/Things"),
    ("encoded-digit", "/api/%745/things", "/api/t5/things"),
    ("encoded-unreserved-marks", "/a%2Db%2Ec%5Fd%7Ee", "/a-b.c_d~e"),
    ("lower-hex-kept-upper", "/a%2fb", "/a%2Fb"),
    ("double-slash-start", "//api/b/things", "/api/b/things"),
    ("double-slash-middle", "/api//b///things", "/api/b/things"),
    ("dot-segment", "/api/b/./things", "/api/b/things"),
    ("dot-dot-segment", "/api/x/../b/things", "/api/b/things"),
    ("encoded-dot-dot", "/api/x/%2e%2E/b/things", "/api/b/things"),
    ("dot-dot-past-root", "/../../api/b/things", "/api/b/things"),
    ("trailing-dot", "/api/b/.", "/api/b/"),
    ("trailing-dot-dot", "/api/b/x/..", "/api/b/"),
    ("slashes-then-dots", "/api/b//../things", "/api/things"),
    ("dots-in-a-name", "/api/b/..things/x.", "/api/b/..things/x."),
    ("empty", "", "/"),
    ("query-kept-as-sent", "/api//b?x=%7e&p=./..//&q=A", "/api/b?x=%7e&p=./..//&q=A"),
    ("query-with-slashes", "/a?next=//b/./c", "/a?next=//b/./c"),
    ("space-encoded", "/api/a b", "/api/a%20b"),
    ("non-ascii-encoded", "/api/café", "/api/caf%C3%A9"),
    ("raw-byte-encoded", "/api/caf\udce9", "/api/caf%E9"),
    ("stray-percent", "/api/50%/x%zz", "/api/50%25/x%25zz"),
    ("percent-at-end", "/api/x%4", "/api/x%254"),
    ("unsafe-ascii", '/a"b<c>d\\e^f`g{h|i}j', "/a%22b%3Cc%3Ed%5Ce%5Ef%60g%7Bh%7Ci%7Dj"),
    ("asterisk-form", "*", "*"),
]


@pytest.mark.parametrize("sent, canonical", [p[1:] for p in PATHS], ids=[p[0] for p in PATHS])
def test_canonical_path(sent, canonical):
    assert canonical_path(sent) == canonical
    assert canonical_path(canonical) == canonical  # idempotent


# Spellings that are NOT the same path: a reserved character and its encoding differ
# (RFC 3986 §2.2), `%2F` is not a slash, `%25` is a percent sign and decodes once, case counts.
DIFFERENT = [
    ("encoded-slash", "/api/a%2Fb/things", "/api/a/b/things"),
    ("encoded-slash-lower", "/api/a%2fb/things", "/api/a/b/things"),
    ("encoded-colon", "/api/a%3Ab", "/api/a:b"),
    ("encoded-at", "/api/a%40b", "/api/a@b"),
    ("encoded-plus", "/api/a%2Bb", "/api/a+b"),
    ("encoded-semicolon", "/api/a%3Bb", "/api/a;b"),
    ("encoded-equals", "/api/a%3Db", "/api/a=b"),
    ("encoded-comma", "/api/a%2Cb", "/api/a,b"),
    ("encoded-ampersand", "/api/a%26b", "/api/a&b"),
    ("encoded-question-mark", "/api/a%3Fb", "/api/a?b"),
    ("percent-once", "/api/%2541", "/api/A"),
    ("percent-once-slash", "/api/%252F", "/api/%2F"),
    ("case", "/API/b/things", "/api/b/things"),
    ("encoded-case", "/api/b/%54hings", "/api/b/things"),
    ("trailing-slash-is-kept", "/api/b/things/", "/api/b/things"),
    ("query-encoding", "/a?x=%7e", "/a?x=~"),
    ("query-dots", "/a?p=./b", "/a?p=b"),
]


@pytest.mark.parametrize("a, b", [d[1:] for d in DIFFERENT], ids=[d[0] for d in DIFFERENT])
def test_what_is_not_merged(a, b):
    assert canonical_path(a) != canonical_path(b)


@pytest.mark.parametrize(
    "sent, kept",
    [
        ("/a%3a", "/a%3A"),
        ("/a%2f", "/a%2F"),
        ("/a%c3%a9", "/a%C3%A9"),
        ("/a%e9", "/a%E9"),
        ("/a%0a", "/a%0A"),
        ("/a%7f", "/a%7F"),
        ("/a%20", "/a%20"),
    ],
)
def test_other_percent_encodings_are_kept_with_upper_case_hex(sent, kept):
    assert canonical_path(sent) == kept


@pytest.mark.parametrize(
    "segment, value",
    [
        ("t5", "t5"),  # nothing to decode: as it was (fingerprints of plain requests do not change)
        ("caf%C3%A9", "café"),
        ("a%20b", "a b"),
        ("a%2Fb", "a/b"),
        ("a%3Ab", "a:b"),
        ("50%25", "50%25"),  # a percent sign stays encoded...
        ("%2541", "%2541"),  # ...so "%41" the text and "A" never meet
        ("caf%E9", "caf%E9"),  # not UTF-8: the bytes stay encoded
        ("%FF%C3%A9", "%FFé"),
    ],
)
def test_param_value(segment, value):
    assert param_value(segment) == value


def test_param_values_of_different_bytes_differ():
    segments = ["%25FF", "%FF", "%25", "%2525", "a%2Fb", "a/b", "%C3%A9", "%E9", "%25C3%25A9"]
    assert len({param_value(s) for s in segments if "/" not in s}) == len([s for s in segments if "/" not in s])


def test_target_keeps_the_raw_spelling():
    t = target("http", "127.1", 8080, "//api/./b/thing%73?q=1")
    assert (t.host, t.path, t.raw_host, t.raw_path) == (
        "127.0.0.1",
        "/api/b/things?q=1",
        "127.1",
        "//api/./b/thing%73?q=1",
    )
    assert t.changed and t.authority == "127.0.0.1:8080"
    same = target("https", "api.test", 443, "/v1/x")
    assert not same.changed and same.authority == "api.test"
    assert target("https", "::1", 8443, "/").authority == "[::1]:8443"


# --- path templates and matching ---------------------------------------------------------------

RULES = """\
api: canon
hosts: [api.test, "0x7f000001:8080"]
operations:
  things.create:
    match: {method: POST, path: "/api/{bucket}/things"}
  cased.create:
    match: {method: POST, path: "/api/{bucket}/cased", case_insensitive: true}
  tilde.create:
    match: {method: POST, path: "/api/%7euser/notes"}
"""
RULESET = RuleSet.of([load_rules(RULES, "canon.yaml")])


@pytest.mark.parametrize(
    "host, port, path, operation, params",
    [
        ("api.test", 443, "/api/b/things", "things.create", {"bucket": "b"}),
        ("API.TEST.", 443, "//api/%62/./thing%73?x=1", "things.create", {"bucket": "b"}),
        ("api.test", 443, "/api/x/../b/things/", "things.create", {"bucket": "b"}),
        ("api.test", 443, "/api/a%2fb/things", "things.create", {"bucket": "a%2Fb"}),  # one segment, not two
        ("api.test", 443, "/api/a/b/things", None, None),
        ("api.test", 443, "/API/b/things", None, None),  # case-sensitive by default
        ("api.test", 443, "/api/b/Things", None, None),
        ("api.test", 443, "/API/b/CASED", "cased.create", {"bucket": "b"}),  # case_insensitive: true
        ("api.test", 443, "/Api/B/cased", "cased.create", {"bucket": "B"}),  # parameters keep their case
        ("api.test", 443, "/api/~user/notes", "tilde.create", {}),  # the template's %7e is ~
        ("api.test", 443, "/api/%7Euser/notes", "tilde.create", {}),
        ("127.0.0.1", 8080, "/api/b/things", "things.create", {"bucket": "b"}),  # the rules' 0x7f000001
        ("127.1", 8080, "/api/b/things", "things.create", {"bucket": "b"}),
        ("2130706433", 8080, "/api/b/things", "things.create", {"bucket": "b"}),
        ("::ffff:127.0.0.1", 8080, "/api/b/things", "things.create", {"bucket": "b"}),
        ("127.0.0.1", 8081, "/api/b/things", None, None),
        ("127.0.0.2", 8080, "/api/b/things", None, None),
    ],
)
def test_match_takes_the_canonical_target(host, port, path, operation, params):
    m = RULESET.match(host, port, "POST", path)
    assert (m.operation.name if m else None) == operation
    if m:
        assert m.params == params


@pytest.mark.parametrize(
    "template, problem",
    [
        ("/api//things", "empty, '.' or '..' segment"),
        ("/api/./things", "empty, '.' or '..' segment"),
        ("/api/{id}/../x", "empty, '.' or '..' segment"),
        ("/api/%2e%2e/x", "empty, '.' or '..' segment"),
    ],
)
def test_a_template_no_canonical_path_can_match_is_refused(template, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_path_template(template)


def test_case_insensitive_folds_ascii_letters_of_the_template_only():
    t = parse_path_template("/api/{id}/Straße", case_insensitive=True)
    assert t.match(canonical_path("/API/x/STRAßE")) == {"id": "x"}
    assert t.match(canonical_path("/api/x/strasse")) is None  # no Unicode case folding: ß is not ss
    assert parse_path_template("/api/x").match("/API/x") is None


@pytest.mark.parametrize(
    "value, error",
    [
        ("yes please", "operations.x.match.case_insensitive: expected true or false"),
        ("1", "operations.x.match.case_insensitive: expected true or false"),
    ],
)
def test_case_insensitive_must_be_a_boolean(value, error):
    text = (
        "api: a\nhosts: [a.test]\noperations:\n  x:\n"
        f"    match: {{method: POST, path: /x, case_insensitive: {value}}}\n"
    )
    with pytest.raises(RulesError, match=re.escape(error)) as e:
        load_rules(text, "a.yaml")
    assert "a.yaml:5" in str(e.value)


# --- allow_hosts: a CONNECT to an alias of an IP host is intercepted too ----------------------


@pytest.mark.parametrize(
    "connect, intercepted",
    [
        ("127.0.0.1:443", True),
        ("127.1:443", True),
        ("127.0.1:443", True),
        ("2130706433:443", True),
        ("0x7f000001:443", True),
        ("0X7F000001:443", True),
        ("0177.0.0.1:443", True),
        ("0x7f.0.0.01:443", True),
        ("127.0.0.1.:443", True),
        ("::ffff:127.0.0.1:443", True),
        ("[::ffff:127.0.0.1]:443", True),
        ("::ffff:7f00:1:443", True),
        ("0:0:0:0:0:ffff:7f00:0001:443", True),
        ("127.0.0.2:443", False),
        ("2130706434:443", False),
        ("0x7f000002:443", False),
        ("10.0.0.1:443", False),
        ("127.0.0.1.example.com:443", False),
        ("api.test:443", False),
    ],
)
def test_host_pattern_of_an_ip_host_matches_its_aliases(connect, intercepted):
    # mitmproxy's next_layer: re.search(rex, "host:port", re.IGNORECASE) for each allow_hosts entry
    assert bool(re.search(host_pattern("127.0.0.1"), connect, re.IGNORECASE)) is intercepted


def test_host_pattern_of_a_name_is_unchanged():
    assert host_pattern("api.github.com") == r"^api\.github\.com\.?:[0-9]+$"
    assert host_pattern("*.x.com:8443") == r"^(?:[^.:]+\.)+x\.com\.?:8443$"
    assert re.search(host_pattern("127.0.0.1:8080"), "127.1:8080") and not re.search(
        host_pattern("127.0.0.1:8080"), "127.1:8081"
    )


# --- the fingerprint and the record ----------------------------------------------------------


def _fp(host, path, port=443, rules=RULESET):
    m = rules.match(host, port, "POST", path)
    assert m is not None
    view = RequestView("POST", "https", host, port, path, {"content-type": "application/json"}, b'{"t": 1}')
    return fingerprint(m, view, KEY)


def test_equivalent_targets_are_one_fingerprint_and_the_raw_one_is_kept():
    plain = _fp("api.test", "/api/b/things")
    assert plain.raw_target is None
    assert plain.target == "https://api.test/api/b/things"
    # (x_thing: a name on no list, redacted all the same; a ?token= would be another caller: caller.py)
    odd = _fp("API.test.", "//api/%62/./thing%73?x_thing=s3cr3t&x=1")
    assert odd.fingerprint == plain.fingerprint
    assert odd.target == "https://api.test/api/b/things?x_thing=REDACTED&x=REDACTED"
    assert odd.raw_target == "https://API.test.//api/%62/./thing%73?x_thing=REDACTED&x=REDACTED"  # redacted like target
    assert "s3cr3t" not in odd.raw_target


def test_a_plain_request_keeps_its_fingerprint():
    """Receipts written before canonical targets still block duplicates: nothing changed for a canonical request."""
    import hashlib

    from proxy_addon.intent.fingerprint import canonical_json

    got = _fp("api.test", "/api/b/things")
    material = {
        "api": "canon",
        "operation": "things.create",
        "method": "POST",
        "host": "api.test",
        "intent": got.intent,
        "principal": "anonymous",
    }
    assert got.intent["path"] == {"bucket": "b"}
    assert got.fingerprint == "sha256:" + hashlib.sha256(canonical_json(material).encode()).hexdigest()


@pytest.mark.parametrize(
    "a, b, same",
    [
        ("/api/%745/things", "/api/t5/things", True),
        ("/api/caf%C3%A9/things", "/api/caf%c3%a9/things", True),
        ("/api/caf%C3%A9/things", "/api/café/things", True),
        ("/api/a%20b/things", "/api/a b/things", True),
        ("/api/a%2Fb/things", "/api/a%2fb/things", True),
        ("/api/%2541/things", "/api/A/things", False),
        ("/api/%FF/things", "/api/%25FF/things", False),
        ("/api/B/things", "/api/b/things", False),
    ],
)
def test_path_parameters_are_fingerprinted_decoded(a, b, same):
    assert (_fp("api.test", a).fingerprint == _fp("api.test", b).fingerprint) is same


def test_the_fingerprint_names_the_canonical_host():
    assert _fp("127.1", "/api/b/things", port=8080).fingerprint == _fp("127.0.0.1", "/api/b/things", 8080).fingerprint
    assert (
        _fp("::ffff:127.0.0.1", "/api/b/things", 8080).fingerprint
        == _fp("127.0.0.1", "/api/b/things", 8080).fingerprint
    )


def test_build_attempt_carries_the_raw_target():
    m = RULESET.match("127.1", 8080, "POST", "/api/b/./things")
    assert m is not None
    a = build_attempt(m, RequestView("POST", "http", "127.1", 8080, "/api/b/./things", {}, b""), KEY)
    assert (a.target, a.raw_target) == ("http://127.0.0.1:8080/api/b/things", "http://127.1:8080/api/b/./things")
    m = RULESET.match("127.0.0.1", 8080, "POST", "/api/b/things")
    assert m is not None
    a = build_attempt(m, RequestView("POST", "http", "127.0.0.1", 8080, "/api/b/things", {}, b""), KEY)
    assert a.raw_target is None


# --- rules explain: matches and fingerprints as the proxy does ---------------------------------


def test_explain_matches_the_canonical_target_and_shows_it():
    report = explain(RULESET, "POST", "https://API.test//api/%62/./thing%73", b"{}", {}, KEY)
    assert report["match"]["operation"] == "things.create"
    assert report["canonical"] == "POST https://api.test/api/b/things"
    text = render(report)
    assert "matched as POST https://api.test/api/b/things (its canonical form; it is forwarded as written)" in text


def test_explain_fingerprint_equals_the_proxys():
    m = RULESET.match("127.1", 8080, "POST", "//api/b/things")
    assert m is not None
    view = RequestView("POST", "http", "127.1", 8080, "//api/b/things", {"content-type": "application/json"}, b"{}")
    proxy_fp = fingerprint(m, view, KEY).fingerprint
    report = explain(
        RULESET, "POST", "http://127.1:8080//api/b/things", b"{}", {"content-type": "application/json"}, KEY
    )
    assert report["fingerprint"]["value"] == proxy_fp


def test_explain_says_when_a_path_differs_in_case_only():
    report = explain(RULESET, "POST", "https://api.test/API/b/things", b"{}", {}, KEY)
    assert report["match"] is None
    assert any(
        "things.create" in line and "letter case only" in line and "case_insensitive" in line for line in report["why"]
    )


# --- canonical forms are fixed points ------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="/.%2eEfF7Aa~-_!:@ é?x\udcff", max_size=40))
def test_canonical_path_is_a_fixed_point(path):
    once = canonical_path("/" + path)
    assert canonical_path(once) == once
    assert once.partition("?")[2] == ("/" + path).partition("?")[2]  # the query as sent


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789xXabcdefABCDEF.:[]", max_size=24))
def test_canonical_host_is_a_fixed_point(host):
    once = canonical_host(host)
    assert canonical_host(once) == once


# --- methods: an override header names the method (issue 17, item 4) ------------------------------

XO, XM, XMO = "X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"


@pytest.mark.parametrize(
    "method, headers, effective",
    [
        ("POST", [], "POST"),
        ("POST", [("Content-Type", "application/json")], "POST"),
        ("GET", [(XO, "POST")], "POST"),
        ("POST", [(XO, "PUT")], "PUT"),
        ("POST", [(XM, "DELETE")], "DELETE"),
        ("POST", [(XMO, "PATCH")], "PATCH"),
        ("GET", [("x-http-method-override", "post")], "POST"),  # header names and methods in any letter case
        ("GET", [("X-Http-Method-Override", " Post ")], "POST"),
        ("GET", [(b"X-HTTP-Method-Override", b"POST")], "POST"),  # mitmproxy's raw fields
        ("GET", [(XO, "POST"), (XM, "post")], "POST"),  # several headers naming one method
        ("GET", [(XO, "POST, POST")], "POST"),
        ("GET", [(XO, "")], "GET"),  # an empty value names nothing
        ("GET", [(XO, " , ")], "GET"),
        ("POST", [(XO, "POST")], "POST"),
        ("POST", [(XO, "NOT A METHOD")], "?"),  # names no method a rule can have; never stored as sent
        ("POST", [(XO, "X" * 100)], "?"),
        ("GET", [("X-HTTP-Method-Overrides", "POST"), ("Method-Override", "POST")], "GET"),  # other headers
    ],
)
def test_effective_method(method, headers, effective):
    assert effective_method(method, headers) == effective


@pytest.mark.parametrize(
    "method, headers",
    [
        ("GET", [(XO, "POST"), (XM, "PUT")]),
        ("POST", [(XO, "PUT"), (XO, "DELETE")]),  # the header repeated
        ("POST", [(XO, "PUT, DELETE")]),  # a comma-separated value: Express takes the first, others the last
        ("GET", [(XO, "POST"), (XMO, "GARBAGE VALUE")]),
        ("POST", [(XO, "POST"), (XM, "PUT")]),  # one names the method sent, the other another one
    ],
)
def test_conflicting_overrides_are_refused_never_guessed(method, headers):
    with pytest.raises(ConflictingOverrides, match="name different methods"):
        effective_method(method, headers)


def test_method_overrides_spells_each_header_as_documented():
    assert method_overrides([("x-http-method", "put"), ("X-METHOD-OVERRIDE", "Put, patch")]) == [
        (XM, "PUT"),
        (XMO, "PUT"),
        (XMO, "PATCH"),
    ]
    assert method_overrides([(XO, "DROP TABLE")]) == [(XO, "?")]  # a value that is no method is never kept


OVERRIDE_RULES = """\
api: over
hosts: [api.test]
operations:
  things.create:
    match: {method: POST, path: "/api/{bucket}/things"}
    fingerprint: {body: [title]}
  things.update:
    match: {method: PUT, path: "/api/{bucket}/things/{id}"}
    fingerprint: {body: [title]}
  strict.create:
    match: {method: POST, path: "/api/{bucket}/strict", method_override: refuse}
  thing.get:
    description: a GET a rule matches, to show an override of a ruled method to an unruled one
    match: {method: GET, path: "/api/{bucket}/things/{id}"}
"""
REFUSING_RULES = """\
api: strict
hosts: [strict.test]
method_override: refuse
operations:
  things.create:
    match: {method: POST, path: "/api/{bucket}/things"}
  things.lenient:
    match: {method: POST, path: "/api/{bucket}/lenient", method_override: honour}
"""
OVERRIDES = RuleSet.of([load_rules(OVERRIDE_RULES, "over.yaml"), load_rules(REFUSING_RULES, "strict.yaml")])


@pytest.mark.parametrize(
    "host, method, path, headers, operation, refused",
    [
        # honour (the default): the method the header names is matched
        ("api.test", "GET", "/api/b/things", [(XO, "POST")], "things.create", None),
        ("api.test", "POST", "/api/b/things/7", [(XO, "PUT")], "things.update", None),
        ("api.test", "POST", "/api/b/things/7", [(XM, "put")], "things.update", None),
        ("api.test", "PATCH", "/api/b/things/7", [(XMO, "PUT")], "things.update", None),
        ("api.test", "GET", "/api/b/things/7", [(XO, "PUT")], "things.update", None),  # not the GET it was sent as
        ("api.test", "POST", "/api/b/things", [(XO, "POST")], "things.create", None),  # names the method sent
        # no operation has the method it names, but the method sent is a ruled write: a guess either way, refused
        ("api.test", "POST", "/api/b/things", [(XO, "GET")], "things.create", "which one is a guess"),
        ("api.test", "POST", "/api/b/things", [(XO, "NOT A METHOD")], "things.create", "which one is a guess"),
        ("api.test", "GET", "/api/b/things/7", [(XO, "DELETE")], "thing.get", "which one is a guess"),
        ("api.test", "GET", "/api/b/other", [(XO, "POST")], None, None),  # neither method matches: untouched
        # several methods named: refused, whichever operation either reading matches
        ("api.test", "GET", "/api/b/things", [(XO, "POST"), (XM, "PUT")], "things.create", "name different methods"),
        (
            "api.test",
            "POST",
            "/api/b/things/7",
            [(XO, "PUT"), (XO, "DELETE")],
            "things.update",
            "name different methods",
        ),
        ("api.test", "GET", "/api/b/nothing", [(XO, "POST"), (XM, "PUT")], None, None),  # nothing ruled: untouched
        # method_override: refuse, in an operation, or for the whole file
        ("api.test", "GET", "/api/b/strict", [(XO, "POST")], "strict.create", "method_override: refuse"),
        ("api.test", "POST", "/api/b/strict", [(XO, "GET")], "strict.create", "method_override: refuse"),
        ("api.test", "POST", "/api/b/strict", [(XO, "POST")], "strict.create", None),  # names the method sent
        ("api.test", "POST", "/api/b/strict", [], "strict.create", None),
        ("strict.test", "GET", "/api/b/things", [(XO, "POST")], "things.create", "method_override: refuse"),
        ("strict.test", "POST", "/api/b/things", [(XMO, "PUT")], "things.create", "method_override: refuse"),
        ("strict.test", "POST", "/api/b/things", [], "things.create", None),
        ("strict.test", "GET", "/api/b/lenient", [(XO, "POST")], "things.lenient", None),  # the operation says honour
    ],
)
def test_match_takes_the_method_an_override_names(host, method, path, headers, operation, refused):
    m = OVERRIDES.match(host, 443, method, path, headers=headers)
    assert (m.operation.name if m else None) == operation
    if m:
        assert (m.refused is None) if refused is None else (refused in (m.refused or "")), m.refused


def test_a_refusal_says_what_to_do_and_never_echoes_a_value():
    m = OVERRIDES.match("strict.test", 443, "GET", "/api/b/things", headers=[(XO, "POST")])
    assert m is not None
    assert m.refused == (
        "GET with X-HTTP-Method-Override: POST: strict things.create does not take method override headers "
        "(method_override: refuse, strict.yaml:5); send the request with the method you mean and without them"
    )
    m = OVERRIDES.match("api.test", 443, "GET", "/api/b/things", headers=[(XO, "POST"), (XM, "SECRET TOKEN")])
    assert m is not None and m.refused is not None
    assert "SECRET" not in m.refused and "X-HTTP-Method: ?" in m.refused


def test_without_headers_match_is_as_before():
    assert OVERRIDES.match("api.test", 443, "GET", "/api/b/things") is None
    m = OVERRIDES.match("api.test", 443, "POST", "/api/b/things")
    assert m is not None and m.operation.name == "things.create"


@pytest.mark.parametrize(
    "text, error",
    [
        ("method_override: sometimes\n", "method_override: 'sometimes' is not one of honour, refuse"),
        ("method_override: honor\n", "method_override: 'honor' is not one of honour, refuse"),
        ("method_override: true\n", "method_override: expected a non-empty string"),
    ],
)
def test_method_override_is_honour_or_refuse(text, error):
    base = "api: a\nhosts: [a.test]\n{top}operations:\n  x:\n    match: {{method: POST, path: /x{op}}}\n"
    with pytest.raises(RulesError, match=re.escape(error)):
        load_rules(base.format(top=text, op=""), "a.yaml")
    value = text.split(": ", 1)[1].strip()
    with pytest.raises(RulesError, match=re.escape("operations.x.match." + error)):
        load_rules(base.format(top="", op=f", method_override: {value}"), "a.yaml")


def test_the_file_sets_each_operations_default():
    rules = {op.name: op.method_override for op in OVERRIDES.operations if op.api == "strict"}
    assert rules == {"things.create": "refuse", "things.lenient": "honour"}
    assert {op.method_override for op in OVERRIDES.operations if op.api == "over"} == {"honour", "refuse"}


def _view(method, path, headers, body=b'{"title": "one"}'):
    return RequestView(method, "https", "api.test", 443, path, {"content-type": "application/json", **headers}, body)


@pytest.mark.parametrize(
    "method, headers",
    [
        ("GET", {"x-http-method-override": "POST"}),
        ("PUT", {"x-http-method": "post"}),
        ("PATCH", {"x-method-override": "Post"}),
        ("POST", {}),
        ("POST", {"x-http-method-override": "post"}),  # names the method sent: a plain POST, nothing to note
    ],
)
def test_an_overridden_method_is_one_intent_with_the_method_it_names(method, headers):
    post = OVERRIDES.match("api.test", 443, "POST", "/api/b/things")
    assert post is not None
    plain = fingerprint(post, _view("POST", "/api/b/things", {}), KEY)
    m = OVERRIDES.match("api.test", 443, method, "/api/b/things", headers=list(headers.items()))
    assert m is not None
    got = fingerprint(m, _view(method, "/api/b/things", headers), KEY)
    assert got.fingerprint == plain.fingerprint
    attempt = build_attempt(m, _view(method, "/api/b/things", headers), KEY)
    assert attempt.method == "POST"  # the receipt records the method it means
    if method == "POST":
        assert "method_override" not in got.intent
    else:  # and how it was sent
        header = next(iter(headers))
        assert got.intent["method_override"] == {
            "sent": method,
            "override": f"{dict((h.lower(), h) for h in (XO, XM, XMO))[header]}: POST",
            "matched": "POST",
        }
        (note,) = intent_notes(got.intent)
        assert note.startswith(f"sent as {method} with ") and "fingerprinted as POST" in note


def test_a_post_overridden_to_put_is_the_put():
    assert OVERRIDES.match("api.test", 443, "POST", "/api/b/things/7") is None  # no rule for a plain POST there
    put = OVERRIDES.match("api.test", 443, "PUT", "/api/b/things/7")
    assert put is not None
    as_put = fingerprint(put, _view("PUT", "/api/b/things/7", {}), KEY)
    over = OVERRIDES.match("api.test", 443, "POST", "/api/b/things/7", headers=[(XO, "PUT")])
    assert over is not None
    got = fingerprint(over, _view("POST", "/api/b/things/7", {"x-http-method-override": "PUT"}), KEY)
    assert got.fingerprint == as_put.fingerprint
    other = fingerprint(put, _view("PUT", "/api/b/things/7", {}, body=b'{"title": "two"}'), KEY)
    assert got.fingerprint != other.fingerprint  # the fields still decide


def test_an_override_to_a_method_no_rule_has_is_refused_with_both_readings():
    m = OVERRIDES.match("api.test", 443, "POST", "/api/b/things", headers=[(XO, "GET")])
    assert m is not None
    assert m.operation.name == "things.create"
    assert m.refused == (
        "POST with X-HTTP-Method-Override: GET: over takes it as GET, which no operation matches, if it honours the "
        "header, or as the POST that things.create matches if it ignores it; which one is a guess, so send the "
        "request with the method you mean and without the header"
    )


def test_explain_matches_the_method_an_override_names():
    headers = {"x-http-method-override": "POST", "content-type": "application/json"}
    report = explain(OVERRIDES, "GET", "https://api.test/api/b/things", b'{"title": "one"}', headers, KEY)
    assert report["match"]["operation"] == "things.create"
    assert report["canonical"] == "POST https://api.test/api/b/things"
    m = OVERRIDES.match("api.test", 443, "GET", "/api/b/things", headers=list(headers.items()))
    assert m is not None
    assert report["fingerprint"]["value"] == fingerprint(m, _view("GET", "/api/b/things", headers), KEY).fingerprint
    text = render(report)
    assert "matched as POST https://api.test/api/b/things" in text
    assert "note: sent as GET with X-HTTP-Method-Override: POST" in text


def test_explain_shows_a_refusal():
    report = explain(
        OVERRIDES, "GET", "https://strict.test/api/b/things", b"{}", {"x-http-method-override": "POST"}, KEY
    )
    assert "method_override: refuse" in report["refused"]
    assert "the proxy refuses this request and sends nothing: GET with X-HTTP-Method-Override: POST" in render(report)
    conflict = explain(
        OVERRIDES,
        "GET",
        "https://api.test/api/b/things",
        b"{}",
        {"x-http-method-override": "POST", "x-http-method": "PUT"},
        KEY,
    )
    assert "name different methods" in conflict["refused"]


def test_explain_says_which_method_an_override_named_when_nothing_matches():
    report = explain(OVERRIDES, "GET", "https://api.test/api/b/other", b"{}", {"x-http-method-override": "POST"}, KEY)
    assert report["match"] is None
    assert "nor does POST, which its method override headers name" in report["why"]


GRAPHQL_RULES = RuleSet.of(
    [
        load_rules(
            """\
api: gql
hosts: [gql.test]
operations:
  issue.create:
    match: {method: POST, path: /graphql, graphql: issueCreate}
""",
            "gql.yaml",
        )
    ]
)
MUTATION = b'{"query": "mutation { issueCreate(input: {title: \\"x\\"}) { id } }"}'


def test_a_graphql_mutation_sent_as_get_with_an_override_is_matched_by_its_body():
    headers = [(XO, "POST")]
    pending = GRAPHQL_RULES.match("gql.test", 443, "GET", "/graphql", headers=headers)
    assert pending is not None
    assert pending.pending and pending.refused is None  # requestheaders: the body decides
    m = GRAPHQL_RULES.match("gql.test", 443, "GET", "/graphql", body=MUTATION, headers=headers)
    assert m is not None
    assert m.operation.name == "issue.create" and m.graphql_args == {"input": {"title": "x"}}
    query = b'{"query": "{ viewer { id } }"}'
    assert GRAPHQL_RULES.match("gql.test", 443, "GET", "/graphql", body=query, headers=headers) is None
    conflict = GRAPHQL_RULES.match("gql.test", 443, "GET", "/graphql", body=MUTATION, headers=[*headers, (XM, "PUT")])
    assert conflict is not None and "name different methods" in (conflict.refused or "")
