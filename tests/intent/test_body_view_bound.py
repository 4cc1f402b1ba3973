"""
The stored intent has a size bound (issue 24, "Wrong answers": `from_server` stored a 5 MB tool
argument; any fingerprinted field could be that large). body_view.bound_intent stores a value
larger than 4 KiB as a keyed hash of it (1 MiB for a value the operation's reconcile read names:
the read needs it), a name longer than 256 characters as a keyed hash, and the fields past a
part's first 256 as one keyed hash; the note `bounded` says which. The fingerprint is taken on the
whole values, before that: no request's fingerprint changes (pinned against the code before the
bound, commit 248c3c8), and two values that differ past the bound are still two intents.
Through a real proxy: tests/e2e/proxy/test_intent_bound.py.
"""

from __future__ import annotations

import json

import pytest

from proxy_addon.errors import ReconcileError
from proxy_addon.intent.body_view import ENTRIES_BOUND, NAME_BOUND, VALUE_BOUND, bound_intent, intent_notes
from proxy_addon.intent.fingerprint import RequestView, fingerprint
from proxy_addon.reconcile.http_reads import render
from proxy_addon.rules import RuleSet, load_rules
from proxy_addon.states import State
from proxy_addon.store import Receipt

RULES = """\
api: bound-api
hosts: [api.test]
operations:
  notes.create:
    match: {method: POST, path: "/notes/{folder}"}
    fingerprint: {headers: [x-tag], body: [title, text]}
  posts.create:
    match: {method: POST, path: "/posts"}
    fingerprint: {body: [title, text]}
    reconcile:
      read: {url: "/posts?title={intent.title}"}
      find: {title: "{intent.title}"}
  forms.create:
    match: {method: POST, path: "/forms"}
"""


KEY = b"0123456789abcdef0123456789abcdef"


RULESET = RuleSet.of([load_rules(RULES, "bound.yaml")])


def intent_of(path: str, body: dict, headers: dict[str, str] | None = None):
    m = RULESET.match("api.test", 443, "POST", path)
    assert m is not None
    view = RequestView(
        "POST",
        "https",
        "api.test",
        443,
        path,
        {"content-type": "application/json", **(headers or {})},
        json.dumps(body).encode(),
    )
    return fingerprint(m, view, KEY)


# Fingerprints computed on the code before the bound (commit 248c3c8), with KEY.
PINNED = {
    "small": "sha256:ec2ba1d30c1da654b44603eb24075e2fe60e4b533a95cab23b39c558891ba26c",
    "large-title": "sha256:57c203808ca426e41a3d728c4582d0c7546298e2f9f6da1ebfbd279de7eeb422",
    "large-header": "sha256:8b267b6ef34653cfdc9173d61511f2dd0dfcb3cd8598da028fca66a8af90f904",
}


CASES = {
    "small": ("/notes/f", {"title": "t", "text": "x"}, {"x-tag": "a"}),
    "large-title": ("/notes/f", {"title": "t" * 10_000, "text": "x"}, {"x-tag": "a"}),
    "large-header": ("/notes/f", {"title": "t", "text": "x"}, {"x-tag": "h" * 6_000}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_fingerprint_is_taken_on_the_whole_values_as_before(case):
    path, body, headers = CASES[case]
    assert intent_of(path, body, headers).fingerprint == PINNED[case]


def test_a_value_past_the_bound_is_stored_as_a_keyed_hash_and_noted():
    big = "t" * (VALUE_BOUND + 1)
    got = intent_of("/notes/f", {"title": big, "text": "x"}, {"x-tag": "h" * 6_000})
    stored = got.intent
    assert stored["body"]["title"].startswith("hmac:") and stored["body"]["text"] == "x"
    assert stored["headers"]["x-tag"].startswith("hmac:")
    assert stored["bounded"] == ["header.x-tag", "intent.title"]
    assert len(json.dumps(stored)) < 1024
    assert any("stored as a keyed hash, never whole" in n for n in intent_notes(stored))
    # Values that differ past the bound are two intents, and two hashes.
    other = intent_of("/notes/f", {"title": big[:-1] + "u", "text": "x"}, {"x-tag": "h" * 6_000})
    assert other.fingerprint != got.fingerprint and other.intent["body"]["title"] != stored["body"]["title"]
    # A value at the bound is stored as it is.
    exact = intent_of("/notes/f", {"title": "t" * (VALUE_BOUND - 2), "text": "x"})
    assert exact.intent["body"]["title"] == "t" * (VALUE_BOUND - 2) and "bounded" not in exact.intent


def test_a_value_the_read_names_is_kept_for_the_read_up_to_a_larger_bound():
    title = "t" * 100_000
    got = intent_of("/posts", {"title": title, "text": "x" * 100_000})
    assert got.intent["body"]["title"] == title  # {intent.title} is in the reconcile read
    assert got.intent["body"]["text"].startswith("hmac:") and got.intent["bounded"] == ["intent.text"]
    huge = intent_of("/posts", {"title": "t" * (2 * 1024 * 1024), "text": "x"})
    assert huge.intent["body"]["title"].startswith("hmac:")
    # A read template naming a value stored as a hash fails to plan: it never looks for the hash.
    receipt = Receipt(
        operation_id="r1",
        api="bound-api",
        operation="posts.create",
        method="POST",
        target="https://api.test/posts",
        intent_fingerprint=huge.fingerprint,
        intent=huge.intent,
        principal="anonymous",
        state=State.OUTCOME_UNKNOWN,
        submitted_at="2026-01-01T00:00:00+00:00",
        updated_at="2026-01-01T00:00:00+00:00",
        completed_at=None,
        http_status=None,
        error=None,
        external_id=None,
        flow_id=None,
        retry_of=None,
        instance=None,
    )
    with pytest.raises(ReconcileError, match=r"\{intent.title\} has no value"):
        render("/posts?title={intent.title}", receipt, url=True)


def test_long_names_and_many_fields_are_bounded_too():
    intent = {"body": {f"params.arguments.a{i:04}": i for i in range(ENTRIES_BOUND + 10)}}
    intent["body"]["params.arguments." + "n" * NAME_BOUND] = 1
    stored = bound_intent(intent, KEY)
    assert len(stored["body"]) == ENTRIES_BOUND + 1  # the first ENTRIES_BOUND, then one hash of the rest
    assert stored["body"]["…"].startswith("hmac:")
    assert "intent.…" in stored["bounded"]
    long_name = bound_intent({"body": {"n" * (NAME_BOUND + 1): 1}}, KEY)
    [name] = long_name["body"]
    assert name.startswith("hmac:") and long_name["bounded"] == [f"intent.{name}"]
    small = {"body": {"a": 1}}
    assert bound_intent(small, KEY) is small  # nothing over a bound: the intent itself, unchanged
