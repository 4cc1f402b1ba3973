"""
How a matched write's JSON is read (issue 24, items 5, 10 and 11), without a proxy: proxy_addon/wire/json_body.py,
the fingerprint's numbers and charsets (intent_body.py, scheme 3), and what matching refuses on MCP and GraphQL
endpoints (wire/mcp_calls.py, gql.py, rules/ruleset.py). The effects through a real proxy:
tests/e2e/proxy/test_json_one_way.py.

The scheme pin: for a corpus of spellings, `fingerprint(..., scheme=2)` gives exactly the fingerprints the code
before issue 24 gave (literals, computed on d26266d), so receipts made before an upgrade are still found; scheme 3
gives the new equalities (1 and 1.0 one intent, 1e400 and 2e400 two, Latin-1 and UTF-8 one).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from proxy_addon.errors import BadJson
from proxy_addon.intent.body_view import canonical_number
from proxy_addon.intent.fingerprint import SCHEME, RequestView, build_attempt, fingerprint
from proxy_addon.outcome.http_answers import bad_json
from proxy_addon.outcome.tool_answers import as_tool_answer
from proxy_addon.rules import RuleSet, load_rules
from proxy_addon.wire.gql import read_mutation
from proxy_addon.wire.json_body import NOT_JSON, UNDECODABLE, JsonNumber, NotStrict, read_json, read_strict
from proxy_addon.wire.mcp_calls import Refused, ToolCall, parse_message, read_call

KEY = b"0123456789abcdef" * 4
RULES = """\
api: spell
hosts: [api.spell.test]
operations:
  things.create:
    match: {method: POST, path: /v1/things}
    fingerprint: {body: [title, amount, meta, tags]}
  form.create:
    match: {method: POST, path: /v1/form}
    fingerprint: {body: [title, amount]}
  issue.create:
    match: {method: POST, path: /graphql, graphql: issueCreate}
    fingerprint: {body: [input.title, input.amount, input.meta]}
  tool.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
    fingerprint: {body: [params.arguments.title, params.arguments.amount, params.arguments.meta]}
  tool.any:
    match: {method: POST, path: /mcp, mcp: {tool: anything}}
"""
J = "application/json"
F = "application/x-www-form-urlencoded"
RS = RuleSet.of([load_rules(RULES, "spell.yaml")])


def mcp(tool: str, args: dict) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": args}})


def gql_vars(amount_text: str) -> str:
    return (
        '{"query": "mutation($i: IssueInput!) { issueCreate(input: $i) { id } }", '
        f'"variables": {{"i": {{"title": "t", "amount": {amount_text}}}}}}}'
    )


def gql_inline(amount_text: str) -> str:
    return json.dumps({"query": f'mutation {{ issueCreate(input: {{title: "t", amount: {amount_text}}}) {{ id }} }}'})


# name: (path, content type, body)
CORPUS = {
    "json 1": ("/v1/things", J, b'{"title": "t", "amount": 1}'),
    "json 1.0": ("/v1/things", J, b'{"title": "t", "amount": 1.0}'),
    "json 100": ("/v1/things", J, b'{"title": "t", "amount": 100}'),
    "json 1e2": ("/v1/things", J, b'{"title": "t", "amount": 1e2}'),
    "json 1E+2": ("/v1/things", J, b'{"title": "t", "amount": 1E+2}'),
    "json 0": ("/v1/things", J, b'{"title": "t", "amount": 0}'),
    "json -0.0": ("/v1/things", J, b'{"title": "t", "amount": -0.0}'),
    "json 0.1": ("/v1/things", J, b'{"title": "t", "amount": 0.1}'),
    "json 0.10": ("/v1/things", J, b'{"title": "t", "amount": 0.10}'),
    "json 0.1000000000000000000001": ("/v1/things", J, b'{"title": "t", "amount": 0.1000000000000000000001}'),
    "json 1e400": ("/v1/things", J, b'{"title": "t", "amount": 1e400}'),
    "json 10e399": ("/v1/things", J, b'{"title": "t", "amount": 10e399}'),
    "json 2e400": ("/v1/things", J, b'{"title": "t", "amount": 2e400}'),
    "json -1e400": ("/v1/things", J, b'{"title": "t", "amount": -1e400}'),
    "json 1e-400": ("/v1/things", J, b'{"title": "t", "amount": 1e-400}'),
    "json 2e-400": ("/v1/things", J, b'{"title": "t", "amount": 2e-400}'),
    "json big int": ("/v1/things", J, b'{"title": "t", "amount": 12345678901234567890}'),
    "json big int as float": ("/v1/things", J, b'{"title": "t", "amount": 1.2345678901234567890e19}'),
    "json meta 1.0": ("/v1/things", J, b'{"title": "t", "meta": {"n": 1.0, "m": [1e400]}}'),
    "json meta 1": ("/v1/things", J, b'{"title": "t", "meta": {"n": 1, "m": [10e399]}}'),
    "json tags 1.0": ("/v1/things", J, b'{"title": "t", "tags": [1.0, 2.5]}'),
    "json tags 1": ("/v1/things", J, b'{"title": "t", "tags": [1, 25e-1]}'),
    "json 45-digit int": ("/v1/things", J, b'{"title": "t", "amount": 1000000000000000000000000000000000000000000000}'),
    "json 1e45": ("/v1/things", J, b'{"title": "t", "amount": 1e45}'),
    "json Infinity": ("/v1/things", J, b'{"title": "t", "amount": Infinity}'),
    "json NaN": ("/v1/things", J, b'{"title": "t", "amount": NaN}'),
    "json 0e99": ("/v1/things", J, b'{"title": "t", "amount": 0e99}'),
    "json string 1": ("/v1/things", J, b'{"title": "t", "amount": "1"}'),
    "json cafe utf-8": ("/v1/things", J, '{"title": "café"}'.encode()),
    "json cafe utf-8 declared": ("/v1/things", J + "; charset=utf-8", '{"title": "café"}'.encode()),
    "json cafe latin-1": ("/v1/things", J + "; charset=latin-1", '{"title": "café"}'.encode("latin-1")),
    "json cafe iso-8859-1 quoted": ("/v1/things", J + '; charset="ISO-8859-1"', '{"title": "café"}'.encode("latin-1")),
    "json cafe utf-16": ("/v1/things", J + "; charset=utf-16", '{"title": "café"}'.encode("utf-16")),
    "json cafe unknown charset": ("/v1/things", J + "; charset=x-nothing", '{"title": "café"}'.encode()),
    "json cafe bad utf-8": ("/v1/things", J + "; charset=utf-8", '{"title": "café"}'.encode("latin-1")),
    "form cafe utf-8": ("/v1/form", F, b"title=caf%C3%A9&amount=1"),
    "form cafe utf-8 raw": ("/v1/form", F, "title=café&amount=1".encode()),
    "form cafe latin-1": ("/v1/form", F + "; charset=latin-1", b"title=caf%E9&amount=1"),
    "form cafe latin-1 raw": ("/v1/form", F + "; charset=latin-1", "title=café&amount=1".encode("latin-1")),
    "form ff": ("/v1/form", F, b"title=%FF&amount=1"),
    "form fe": ("/v1/form", F, b"title=%FE&amount=1"),
    "json as form": ("/v1/form", J, b'{"title": "caf\\u00e9", "amount": "1"}'),
    "gql vars 1": ("/graphql", J, gql_vars("1").encode()),
    "gql vars 1.0": ("/graphql", J, gql_vars("1.0").encode()),
    "gql vars 1e400": ("/graphql", J, gql_vars("1e400").encode()),
    "gql vars 2e400": ("/graphql", J, gql_vars("2e400").encode()),
    "gql inline 1": ("/graphql", J, gql_inline("1").encode()),
    "gql inline 1.0": ("/graphql", J, gql_inline("1.0").encode()),
    "gql inline 1e400": ("/graphql", J, gql_inline("1e400").encode()),
    "gql inline 2e400": ("/graphql", J, gql_inline("2e400").encode()),
    "mcp 1": ("/mcp", J, mcp("create_issue", {"title": "t", "amount": 1}).encode()),
    "mcp 1.0": ("/mcp", J, mcp("create_issue", {"title": "t", "amount": 1.0}).encode()),
    "mcp 1e400": (
        "/mcp",
        J,
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "create_issue", "arguments": '
        b'{"title": "t", "amount": 1e400}}}',
    ),
    "mcp 2e400": (
        "/mcp",
        J,
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "create_issue", "arguments": '
        b'{"title": "t", "amount": 2e400}}}',
    ),
    "mcp all 1": ("/mcp", J, mcp("anything", {"n": 1, "o": {"x": 2}}).encode()),
    "mcp all 1.0": ("/mcp", J, mcp("anything", {"n": 1.0, "o": {"x": 2.0}}).encode()),
}


# What the code before issue 24 gave each request (scheme 2, then unversioned), key KEY: sha256:<these>.
SCHEME_2 = {
    "json 1": "416d7bc300ee816388dea3c9a5bd535b4f7e679ab4f6a23f131e6ea4563c325e",
    "json 1.0": "565f82749d1d684c5d04d578424e0c95d787453deddfb46e9d0c33b5d00f7f23",
    "json 100": "7af299d24a96b0d3e68409c7410113d66e1e1cd603fa54c64f5f7ac35e06ddb6",
    "json 1e2": "3949e9f9f3f01791d70b3a20573a0325e3c694c9d20a1bb823e651bee834b7d5",
    "json 1E+2": "3949e9f9f3f01791d70b3a20573a0325e3c694c9d20a1bb823e651bee834b7d5",
    "json 0": "b85e3998036d7e2cd00ec872bcd6f99a9fa2777c192737be4279b3240e511a64",
    "json -0.0": "d8c24f787191fa17dfe5bd0f2eaf1ab6b9ccd68a8f3237d0bedc710df9fef821",
    "json 0.1": "694e1e03ffd84e3f426e525aa2d74b474a963a7eb1ade36f919a438de518c33b",
    "json 0.10": "694e1e03ffd84e3f426e525aa2d74b474a963a7eb1ade36f919a438de518c33b",
    "json 0.1000000000000000000001": "694e1e03ffd84e3f426e525aa2d74b474a963a7eb1ade36f919a438de518c33b",
    "json 1e400": "3ab6979601e8020846e93a25f291ae99e0bbdf371926cefe345c9ada5bcca1c8",
    "json 10e399": "3ab6979601e8020846e93a25f291ae99e0bbdf371926cefe345c9ada5bcca1c8",
    "json 2e400": "3ab6979601e8020846e93a25f291ae99e0bbdf371926cefe345c9ada5bcca1c8",
    "json -1e400": "bf0b6e74b9f678c5d4a21f462c1acc74a44586e7d2e2181fceff4c7af8397111",
    "json 1e-400": "83f121301240b1026f4b29d99682d6805872033b12a6ad6d3ccb01379c92caac",
    "json 2e-400": "83f121301240b1026f4b29d99682d6805872033b12a6ad6d3ccb01379c92caac",
    "json big int": "ab4659e1265204fcd99b09c4047fd031e439005ce1e1ad51f66b8ab08833900d",
    "json big int as float": "4832dbee75103fbd8b8212f88e41d1e5a79500bd332bd7f63abeb34e19f69735",
    "json meta 1.0": "13f7a21537fe01222e68961e688cf71a2458c54d4af021bb32e2c391e8b193a0",
    "json meta 1": "84a24b12d903c9f5ec38786f643e2e3c7345e19c6137de57dae3ade6f8c0ab99",
    "json tags 1.0": "0d26f38626669284964ef4125968d125d6e8596c2a79d67feecc3d2854478582",
    "json tags 1": "39d1a7e3f09f8c7c27de84e5c159fb366039a80f465470942de86eee8e991b45",
    "json 45-digit int": "287899775c4c0acd28a7bb0afbf761da11d4f3ae576386bce6e393ca447c19e2",
    "json 1e45": "b7cfc9f245b51d487a86483c69828620e47d5d9f1e6910df28dead5fd822d4d9",
    "json Infinity": "3ab6979601e8020846e93a25f291ae99e0bbdf371926cefe345c9ada5bcca1c8",
    "json NaN": "5cfd993ebb4ec3a7f5aed0c323bb8fc3e37aca085d73c46a8bca278bb33ef2c8",
    "json 0e99": "83f121301240b1026f4b29d99682d6805872033b12a6ad6d3ccb01379c92caac",
    "json string 1": "c69d42261ba5c9490f1c8c054b59e03771ff2b21465b7977efeca30548002790",
    "json cafe utf-8": "fecfa7fd3196871b168c8e53d752f4f57281928582ec2fa305f00aa7b7f2d7a5",
    "json cafe utf-8 declared": "fecfa7fd3196871b168c8e53d752f4f57281928582ec2fa305f00aa7b7f2d7a5",
    "json cafe latin-1": "e5cd6a41a78ebd41a12c91adb0ea2fcfb319d10f62668c2fddefeeb4ad5f72f1",
    "json cafe iso-8859-1 quoted": "e5cd6a41a78ebd41a12c91adb0ea2fcfb319d10f62668c2fddefeeb4ad5f72f1",
    "json cafe utf-16": "fecfa7fd3196871b168c8e53d752f4f57281928582ec2fa305f00aa7b7f2d7a5",
    "json cafe unknown charset": "fecfa7fd3196871b168c8e53d752f4f57281928582ec2fa305f00aa7b7f2d7a5",
    "json cafe bad utf-8": "e5cd6a41a78ebd41a12c91adb0ea2fcfb319d10f62668c2fddefeeb4ad5f72f1",
    "form cafe utf-8": "20f767c23c79d37dd40597b35e1d0b0c8f5414269698879ae8e02212c152f2e5",
    "form cafe utf-8 raw": "20f767c23c79d37dd40597b35e1d0b0c8f5414269698879ae8e02212c152f2e5",
    "form cafe latin-1": "dd9d7585543f059351262bc7bb09e19efd0082e93494f77ede4b51d9d6ccd69f",
    "form cafe latin-1 raw": "3408dbbdeac2745007721d1e39ff1ab4bc4295847276c900768f45c69679735c",
    "form ff": "6aab5f6fd3daeda74ad5bd9d9f42b9c892d9de3992a6c9e0c4cb2936d14d60e5",
    "form fe": "6aab5f6fd3daeda74ad5bd9d9f42b9c892d9de3992a6c9e0c4cb2936d14d60e5",
    "json as form": "cd6d6dfffa4a86284b926c4919c94a00bd17e46bdd52dbbae5fe6ee3d83e3e31",
    "gql vars 1": "34afc4edc7817089dde9b22d170a47221b150e9ceff16ce91aa36a3113f31917",
    "gql vars 1.0": "ef018cc8b34e3e4b0b466ed6fe270b12db82a1a20e066a22f9f571d934a852da",
    "gql vars 1e400": "6bf782a00827ccfbbd16d9bd834354c80b0e789b99ad60efff4db4909e637821",
    "gql vars 2e400": "6bf782a00827ccfbbd16d9bd834354c80b0e789b99ad60efff4db4909e637821",
    "gql inline 1": "34afc4edc7817089dde9b22d170a47221b150e9ceff16ce91aa36a3113f31917",
    "gql inline 1.0": "ef018cc8b34e3e4b0b466ed6fe270b12db82a1a20e066a22f9f571d934a852da",
    "gql inline 1e400": "6bf782a00827ccfbbd16d9bd834354c80b0e789b99ad60efff4db4909e637821",
    "gql inline 2e400": "6bf782a00827ccfbbd16d9bd834354c80b0e789b99ad60efff4db4909e637821",
    "mcp 1": "367d98d6f97b0c04774aee56e20d71ea2fe1cc86539b37038a6926917dd7339f",
    "mcp 1.0": "0c396d84dde2cf71cfb2174f480e4fdf07ac9ea1642a5f57cb363d39059431af",
    "mcp 1e400": "37a78af10dfca3be5626894c56fd66de551db0b7203f7d90f538049acdee819e",
    "mcp 2e400": "37a78af10dfca3be5626894c56fd66de551db0b7203f7d90f538049acdee819e",
    "mcp all 1": "1625f828b3a8df13cc807fcd26d8391ab17e0b4f160bcb7bffe82e74769c01e4",
    "mcp all 1.0": "06ce86c903c7b8c916a12cdcc744a8f5a98a26a39f6dae4f6e62cdda19039152",
}

# Under scheme 3, the requests of a group are one intent, and no two groups are.
SCHEME_3_GROUPS = [
    ["json 1", "json 1.0"],
    ["json 100", "json 1e2", "json 1E+2"],
    ["json 0", "json -0.0", "json 0e99"],
    ["json 0.1", "json 0.10"],
    ["json 0.1000000000000000000001"],
    ["json 1e400", "json 10e399"],
    ["json 2e400"],
    ["json -1e400"],
    ["json 1e-400"],
    ["json 2e-400"],
    ["json big int", "json big int as float"],
    ["json 45-digit int", "json 1e45"],
    ["json Infinity"],
    ["json NaN"],
    ["json meta 1.0", "json meta 1"],
    ["json tags 1.0", "json tags 1"],
    ["json string 1"],
    [
        "json cafe utf-8",
        "json cafe utf-8 declared",
        "json cafe latin-1",
        "json cafe iso-8859-1 quoted",
        "json cafe utf-16",
    ],
    ["json cafe unknown charset"],
    ["json cafe bad utf-8"],
    ["form cafe utf-8", "form cafe utf-8 raw", "form cafe latin-1", "form cafe latin-1 raw"],
    ["form ff"],
    ["form fe"],
    ["json as form"],
    ["gql vars 1", "gql vars 1.0", "gql inline 1", "gql inline 1.0"],
    ["gql vars 1e400", "gql inline 1e400"],
    ["gql vars 2e400", "gql inline 2e400"],
    ["mcp 1", "mcp 1.0"],
    ["mcp 1e400"],
    ["mcp 2e400"],
    ["mcp all 1", "mcp all 1.0"],
]


def fp(name: str, scheme: int):
    path, ctype, body = CORPUS[name]
    headers = {"content-type": ctype}
    m = RS.match("api.spell.test", 443, "POST", path, body=body, headers=list(headers.items()))
    assert m is not None and not m.refused, name
    return fingerprint(m, RequestView("POST", "https", "api.spell.test", 443, path, headers, body), KEY, scheme=scheme)


@pytest.mark.parametrize("name", list(CORPUS))
def test_scheme_2_gives_the_fingerprints_of_before(name):
    assert fp(name, 2).fingerprint == "sha256:" + SCHEME_2[name]


def test_scheme_3_reads_numbers_by_value_and_bodies_by_their_charset():
    assert SCHEME == 3
    assert sorted(n for g in SCHEME_3_GROUPS for n in g) == sorted(CORPUS)
    prints = [{fp(n, 3).fingerprint for n in group} for group in SCHEME_3_GROUPS]
    assert [len(p) for p in prints] == [1] * len(prints), "a group's spellings are one intent"
    assert len(set().union(*prints)) == len(prints), "two groups are never one intent"
    # and scheme 2 did collapse some of them, or split others: the pin above is not scheme 3's
    assert SCHEME_2["json 1e400"] == SCHEME_2["json 2e400"] == SCHEME_2["json Infinity"]
    assert SCHEME_2["json 1"] != SCHEME_2["json 1.0"] and SCHEME_2["form ff"] == SCHEME_2["form fe"]


def test_the_stored_intent_shows_numbers_by_value_and_hashes_what_no_double_holds():
    assert fp("json 1e2", 3).intent["body"]["amount"] == 100
    assert fp("json 0.10", 3).intent["body"]["amount"] == 0.1
    assert fp("json 1e400", 3).intent["body"]["amount"].startswith("hmac:")
    assert fp("json cafe latin-1", 3).intent["body"]["title"] == "café"
    assert fp("json cafe unknown charset", 3).intent["fallback"] == "bad_charset"
    assert fp("form ff", 3).intent["fallback"] == "bad_form"  # scheme 2 read %FF and %FE both as U+FFFD
    # a form and the same fields as JSON stay two intents: a form's values are text, JSON's are typed
    assert fp("form cafe utf-8", 3).intent["form"] == {"title": "café", "amount": "1"}
    assert fp("form cafe utf-8", 3).fingerprint != fp("json as form", 3).fingerprint


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1.0", 1),
        ("1e2", 100),
        ("-0.0", 0),
        ("0e99", 0),
        ("2.5", 2.5),
        ("25e-1", 2.5),
        ("1e-7", 1e-07),
        ("1e39", 10**39),
        ("1.2345678901234567890e19", 12345678901234567890),
    ],
)
def test_canonical_number(text, expected):
    got = canonical_number(JsonNumber(text), KEY)
    assert got == expected and type(got) is type(expected)


def test_canonical_number_hashes_what_no_double_or_short_int_holds():
    hashed = {t: canonical_number(JsonNumber(t), KEY) for t in ("1e400", "10e399", "2e400", "1e40", "1e-400")}
    assert hashed["1e400"] == hashed["10e399"] and len(set(hashed.values())) == 4
    assert all(isinstance(h, str) and h.startswith("hmac:") for h in hashed.values())
    assert canonical_number(10**40, KEY) == hashed["1e40"]  # an int literal and its exponent spelling: one value
    assert canonical_number(float("inf"), KEY) != hashed["1e400"]  # Infinity (not JSON) is no number's hash
    assert canonical_number(10**39, KEY) == 10**39 and canonical_number(True, KEY) is True


# --- a key twice ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, where",
    [
        (b'{"title": "a", "title": "b"}', "'title' twice in the object at the top level"),
        (b'{"a": {"b": [1, {"c": 1, "c": 2}]}}', "'c' twice in the object at a.b.1"),
        (b'[{}, {"x": {"k": 1, "k": 1}}]', "'k' twice in the object at 1.x"),
    ],
)
def test_read_json_refuses_a_key_twice_naming_it_and_where(body, where):
    with pytest.raises(BadJson) as e:
        read_json(body)
    assert where in str(e.value) and "servers disagree" in str(e.value)


def test_read_json():
    assert read_json(b'{"a": 1.0, "b": 2}') == {"a": 1.0, "b": 2}
    assert read_json(b'{"a": 1.5}')["a"].text == "1.5"
    assert read_json(b"not json") is NOT_JSON and read_json(b"") is NOT_JSON
    assert read_json(b'{"a": 1, "a": 2') is NOT_JSON  # not JSON at all: hashed whole, not refused
    assert read_json('{"t": "é"}'.encode("latin-1")) is NOT_JSON
    assert read_json('{"t": "é"}'.encode("latin-1"), "iso8859-1") == {"t": "é"}
    assert read_json(b'{"t": "\xff"}', "ascii") is UNDECODABLE
    assert read_json(b'{"A": 1, "a": 2}') == {"A": 1, "a": 2}  # keys that differ by case: two keys, for REST


def test_a_rest_write_with_a_key_twice_is_refused_before_any_receipt():
    body = b'{"title": "t", "meta": {"id": 1, "id": 2}}'
    m = RS.match("api.spell.test", 443, "POST", "/v1/things")
    assert m is not None
    view = RequestView("POST", "https", "api.spell.test", 443, "/v1/things", {"content-type": J}, body)
    for call in (
        lambda: fingerprint(m, view, KEY),
        lambda: fingerprint(m, view, KEY, scheme=2),
        lambda: build_attempt(m, view, KEY),
    ):
        with pytest.raises(BadJson, match="'id' twice in the object at meta"):
            call()
    answer = bad_json("spell", "things.create", "the JSON body has the key 'id' twice")
    assert answer.status == 400 and json.loads(answer.body)["error"] == "bad_json"


# --- strict bodies: MCP and GraphQL ----------------------------------------------------------------


@pytest.mark.parametrize(
    "body, says",
    [
        (b'{"t": "caf\xe9"}', "is not UTF-8 (byte 0xe9 at offset 10)"),
        (b'{"t": "\xed\xa0\x80"}', "is not UTF-8"),  # an encoded surrogate (Python's json.loads took it)
        ('\ufeff{"t": 1}'.encode(), "is not JSON (Unexpected UTF-8 BOM"),
        (b'{"t": NaN}', "holds NaN, which is not JSON"),
        (b'{"t": "\\ud800"}', "lone surrogate escape (\\ud800-\\udfff) in a string at t"),
        (b'{"a": {"k": 1, "K": 2}}', "the keys 'k' and 'K', which differ only by case, in the object at a"),
        ('{"params": 1, "param\u017f": 2}'.encode(), "differ only by case"),  # U+017F folds to s, as Go folds it
        (b'{"a": 1, "a": 1}', "the key 'a' twice in the object at the top level"),
        (b"not json", "is not JSON (Expecting value at offset 0)"),
    ],
)
def test_read_strict_refuses_what_servers_read_otherwise(body, says):
    got = read_strict(body, "the body", fold=True)
    assert isinstance(got, NotStrict) and says in got.why, got


def test_read_strict_takes_strict_json():
    doc = read_strict('{"t": "café \\ud83d\\ude00", "n": [1, 2.0]}'.encode(), "the body", fold=True)
    assert doc == {"t": "café \U0001f600", "n": [1, 2.0]} and isinstance(doc["n"][1], JsonNumber)
    assert read_strict(b'{"k": 1, "K": 2}', "the body", fold=False) == {"k": 1, "K": 2}


@pytest.mark.parametrize(
    "body, says",
    [
        (b'{"jsonrpc": "2.0", "id": 1, "Method": "tools/call", "params": {"name": "x"}}', "'Method' at the top level"),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "METHOD": "tools/call"}', "differ only by case"),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x", "Arguments": {}}}',
            "'Arguments' at params",
        ),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping", "Params": {}}]', "'Params' at 0"),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x", "arguments": {"a": "\xff"}}}',
            "not UTF-8",
        ),
    ],
)
def test_mcp_bodies_read_two_ways_are_refused_as_bad_json(body, says):
    got = parse_message(body)
    assert isinstance(got, Refused) and got.reason == "bad_json" and says in got.why, got
    m = RS.match("api.spell.test", 443, "POST", "/mcp", body=body)
    assert m is not None and m.refused_as == "bad_json" and m.refused == got.why


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc": "2.0", "id": 0, "result": {"action": "accept", "content": {"note": "a", "Note": "b"}}}',
        b'{"jsonrpc": "2.0", "id": 0, "result": {"action": "accept", "action": "decline"}}',
        b'{"jsonrpc": "2.0", "id": 0, "id": 1, "result": {}}',
        b'{"jsonrpc": "2.0", "id": 0, "Result": {"content": {"type": "text", "text": "\\ud800"}}}',
        b'{"jsonrpc": "2.0", "id": 0, "result": {"temperature": NaN}}',
        b'{"jsonrpc": "2.0", "id": 0, "error": {"code": -1, "message": "no", "Message": "non"}}',
    ],
)
def test_a_clients_answer_to_the_server_passes_whatever_its_result_holds(body):
    """
    A body with no `method` in any spelling is the client's answer to a server's request (elicitation,
    sampling, roots): no reader takes it for a request, so it is never a tool call, and never refused.
    """
    doc = parse_message(body)
    assert isinstance(doc, dict) and "method" not in doc, doc
    assert read_call(doc, {}) is None
    assert RS.match("api.spell.test", 443, "POST", "/mcp", body=body) is None  # no rule: passed untouched
    # A gateway that routes by the 2026-07-28 header would take it for a tool call: refused, as any disagreement.
    assert isinstance(read_call(doc, {"mcp-method": "tools/call"}), Refused)


@pytest.mark.parametrize(
    "body, says",
    [
        (
            b'{"jsonrpc": "2.0", "id": 0, "result": {}, "Method": "tools/call", "params": {"name": "create_issue"}}',
            "'Method' at the top level",
        ),
        (b'{"jsonrpc": "2.0", "id": 0, "result": {"a": 1, "a": 2}, "method": "tools/call"}', "twice"),
        (b'{"jsonrpc": "2.0", "id": 0, "result": {"note": "\xff"}}', "not UTF-8"),
        (
            b'{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "RequestId": 2}}',
            "differ only by case",
        ),
    ],
)
def test_an_answer_that_may_be_a_request_is_still_refused(body, says):
    """A `method` key in any spelling, or bytes that are not UTF-8 (decoders disagree on them): the strict rules."""
    got = parse_message(body)
    assert isinstance(got, Refused) and got.reason == "bad_json" and says in got.why, got


@pytest.mark.parametrize(
    "doc, says",
    [
        ({"Query": "mutation { issueCreate(input: {}) { id } }"}, "'Query' at the top level"),
        ({"query": "query { a }", "QUERY": "mutation { issueCreate(input: {}) { id } }"}, "differ only by case"),
        ({"query": "mutation { issueCreate(input: {}) { id } }", "OperationName": "x"}, "'OperationName'"),
    ],
)
def test_graphql_bodies_read_two_ways_are_refused_as_bad_json(doc, says):
    body = json.dumps(doc).encode()
    got = read_mutation(body)
    assert isinstance(got, NotStrict) and says in got.why, got
    m = RS.match("api.spell.test", 443, "POST", "/graphql", body=body)
    assert m is not None and m.refused_as == "bad_json" and says in (m.refused or "")


def test_graphql_variables_are_maps_read_exactly():
    """A variables object is a map to every server (gqlgen too): keys in two cases are two variables, not refused."""
    body = json.dumps(
        {
            "query": "mutation($a: String, $A: String) { issueCreate(input: {title: $a}) { id } }",
            "variables": {"a": "x", "A": "y"},
        }
    ).encode()
    assert read_mutation(body) == {"issueCreate": {"input": {"title": "x"}}}
    twice = body.replace(b'"A": "y"', b'"a": "y"')
    got = read_mutation(twice)
    assert isinstance(got, NotStrict) and "the key 'a' twice in the object at variables" in got.why


def test_a_refused_mcp_call_is_answered_with_a_json_rpc_error_under_its_own_id():
    answer = as_tool_answer(
        bad_json("spell", "tool.create", "the JSON-RPC body is not UTF-8"), ToolCall(7, "x"), "application/json"
    )
    doc = json.loads(answer.body)
    assert answer.status == 400 and doc["id"] == 7 and doc["error"]["code"] == -32600
    assert "not UTF-8" in doc["error"]["message"]


def test_rules_explain_says_a_body_with_a_key_twice_is_refused():
    from proxy_addon.explain import explain

    report = explain(
        RS, "POST", "https://api.spell.test/v1/things", b'{"title": "a", "title": "b"}', {"content-type": J}, KEY
    )
    assert report["match"]["operation"] == "things.create"
    assert "'title' twice in the object at the top level" in report["refused"]
    mcp_report = explain(
        RS,
        "POST",
        "https://api.spell.test/mcp",
        b'{"jsonrpc": "2.0", "Method": "tools/call"}',
        {"content-type": J},
        KEY,
    )
    assert "'Method'" in mcp_report["refused"]


def test_a_named_argument_spelled_in_another_case_is_refused():
    """Go decodes `Title` into the tool's `title`; the fingerprint would count it missing, so calls would merge."""
    body = mcp("create_issue", {"Title": "x", "amount": 1}).encode()
    m = RS.match("api.spell.test", 443, "POST", "/mcp", body=body)
    assert m is not None
    view = RequestView("POST", "https", "api.spell.test", 443, "/mcp", {"content-type": J}, body)
    with pytest.raises(BadJson, match=r"the key 'Title' at params.arguments, .* reads as the argument 'title'"):
        fingerprint(m, view, KEY)
    nested = mcp("create_issue", {"title": "x", "meta": {"Id": 1}}).encode()  # `meta` named whole: not read inside
    m = RS.match("api.spell.test", 443, "POST", "/mcp", body=nested)
    assert m is not None
    assert fingerprint(m, dataclasses.replace(view, body=nested), KEY).intent["body"]["params.arguments.title"] == "x"


def test_two_keys_that_are_one_text_in_nfc_are_refused():
    """The fingerprint reads keys in NFC (one key), a server as two: which one counts is a guess."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    body = json.dumps({"meta": {nfc: 1, nfd: 2}}, ensure_ascii=False).encode()
    with pytest.raises(BadJson, match="one text in two Unicode forms, in the object at meta"):
        read_json(body)
    kelvin = json.dumps({"K": 1, "\u212a": 2}).encode()  # the Kelvin sign is K in NFC (escaped: an ASCII body)
    with pytest.raises(BadJson, match="one text in two Unicode forms"):
        read_json(kelvin)
    assert read_json(json.dumps({nfc: 1, "cafe": 2}, ensure_ascii=False).encode()) == {nfc: 1, "cafe": 2}
    got = read_strict(json.dumps({"params": {nfc: 1, nfd: 2}}).encode(), "the body", fold=True)
    assert isinstance(got, NotStrict) and "one text in two Unicode forms" in got.why


def test_a_number_stored_as_a_keyed_hash_is_no_value_a_read_can_look_for():
    """A read for `{intent.amount}` must fail to plan, not search for the hash and prove absence."""
    from proxy_addon.errors import ReconcileError
    from proxy_addon.reconcile.http_reads import value_of
    from proxy_addon.states import State
    from proxy_addon.store import Receipt

    intent = fp("json 1e400", 3).intent
    assert intent["hashed"] == ["amount"] and fp("json 1", 3).intent.get("hashed") is None
    assert fp("json 2e400", 2).intent.get("hashed") is None  # scheme 2 stored it as the float inf
    r = Receipt(
        operation_id="r1",
        api="spell",
        operation="things.create",
        method="POST",
        target="https://api.spell.test/v1/things",
        state=State.OUTCOME_UNKNOWN,
        intent_fingerprint="sha256:x",
        intent=intent,
        principal="anonymous",
        submitted_at="2026-11-29T10:00:00.000000Z",
        updated_at="",
        completed_at=None,
        http_status=None,
        error=None,
        external_id=None,
        flow_id=None,
        retry_of=None,
        instance=None,
    )
    assert value_of("intent.title", r) == "t"
    with pytest.raises(ReconcileError, match=r"intent.amount"):
        value_of("intent.amount", r)
    listed = json.dumps({"title": "t", "tags": [1, 2]}).encode().replace(b"2]", b"1e400]")
    m = RS.match("api.spell.test", 443, "POST", "/v1/things")
    assert m is not None
    view = RequestView("POST", "https", "api.spell.test", 443, "/v1/things", {"content-type": J}, listed)
    got = fingerprint(m, view, KEY).intent
    assert got["hashed"] == ["tags"] and got["body"]["tags"][0] == 1 and got["body"]["tags"][1].startswith("hmac:")
    args = fp("mcp all 1", 3).intent
    assert args["hashed"] == ["params.arguments.o"]


RECONCILED = """\
api: shop
hosts: [api.shop.test]
operations:
  orders.create:
    match: {method: POST, path: /v1/orders}
    fingerprint: {body: [title, amount]}
    reconcile:
      read: {method: GET, url: /v1/orders}
      find: {title: "{intent.title}", amount: "{intent.amount}"}
      absence_provable: true
      retry_when_absent: true
"""


@pytest.mark.parametrize(
    "sent, answered, found",
    [(b"1.0", b"1", True), (b"1", b"1.0", True), (b"1e2", b"100.0", True), (b"1", b"1.5", False)],
    ids=["sent-1.0-read-1", "sent-1-read-1.0", "sent-1e2-read-100.0", "another-number"],
)
def test_a_reconcile_read_finds_a_number_by_its_value(sent, answered, found):
    """Before: `{intent.amount}` rendered 1.0 and an API answering 1 was 'absent': safe_to_retry, a second write."""
    from proxy_addon.reconcile.http_reads import plan_read
    from proxy_addon.reconcile.judge import judge
    from proxy_addon.states import State
    from proxy_addon.store import Receipt

    rules = RuleSet.of([load_rules(RECONCILED, "shop.yaml")])
    body = b'{"title": "mug", "amount": ' + sent + b"}"
    m = rules.match("api.shop.test", 443, "POST", "/v1/orders")
    assert m is not None and m.operation.reconcile is not None
    view = RequestView("POST", "https", "api.shop.test", 443, "/v1/orders", {"content-type": J}, body)
    r = Receipt(
        operation_id="r1",
        api="shop",
        operation="orders.create",
        method="POST",
        target="https://api.shop.test/v1/orders",
        state=State.RECONCILING,
        intent_fingerprint="sha256:x",
        intent=fingerprint(m, view, KEY).intent,
        principal="anonymous",
        submitted_at="2026-01-01T00:00:00Z",
        updated_at="2026-01-01T00:00:01Z",
        completed_at="2026-01-01T00:00:01Z",
        http_status=None,
        error=None,
        external_id=None,
        flow_id=None,
        retry_of=None,
        instance=None,
    )
    answer = b'[{"title": "mug", "amount": ' + answered + b"}]"
    verdict = judge(m.operation.reconcile, plan_read(m.operation, r), r, 200, answer)
    assert verdict.state is (State.SUCCEEDED if found else State.SAFE_TO_RETRY), verdict.reason
