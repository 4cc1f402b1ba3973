"""`reconcile.pages`: how a read's list continues, as the loader takes it, as `rules check` demands
it, and as the judge follows it (the walk itself runs through a real proxy in
tests/e2e/reconcile/test_paginated_reads.py)."""

from __future__ import annotations

import json

import pytest

from proxy_addon.errors import RulesError
from proxy_addon.reconcile.http_reads import plan_read
from proxy_addon.reconcile.judge import judge
from proxy_addon.rules import check_rules_path, load_rules
from proxy_addon.states import State
from tests.reconcile.test_http_reads import BASE, INTENT, receipt

PAGED = BASE + "      pages: {next: {more: has_more, from: data.-1.id, param: starting_after}, max: 3}\n"
LINKED = BASE + "      pages: {next: link}\n"


def spec_of(text: str):
    return load_rules(text, "blog.yaml").operations[0].reconcile


def test_pages_load():
    p = spec_of(PAGED).pages
    assert (p.link, p.more, p.from_, p.param, p.max) == (False, "has_more", "data.-1.id", "starting_after", 3)
    p = spec_of(LINKED).pages
    assert (p.link, p.max) == (True, 5)  # max defaults to 5
    assert spec_of(BASE).pages is None and not spec_of(BASE).complete_in_one_page
    one = BASE + "      complete_in_one_page: true   # the slug is unique: one item at most\n"
    assert spec_of(one).complete_in_one_page
    above = BASE + "      # the slug is unique: one item at most\n      complete_in_one_page: true\n"
    assert spec_of(above).complete_in_one_page


@pytest.mark.parametrize(
    "tail, field, message",
    [
        ("      pages: {next: links}\n", "reconcile.pages.next", "expected link"),
        ("      pages: {next: link, max: 0}\n", "reconcile.pages.max", "from 1 to 100"),
        ("      pages: {next: link, max: 101}\n", "reconcile.pages.max", "from 1 to 100"),
        ("      pages: {next: link, max: lots}\n", "reconcile.pages.max", "whole number"),
        ("      pages: {max: 3}\n", "reconcile.pages.next", "is required"),
        ("      pages: {next: {from: next_cursor}}\n", "reconcile.pages.next.param", "is required"),
        ("      pages: {next: {from: x, param: p, cursor: y}}\n", "reconcile.pages.next.cursor", "unknown key"),
        ("      pages: {next: {from: 'a..b', param: p}}\n", "reconcile.pages.next.from", "not a dotted field path"),
        ("      pages: {next: {from: a, param: 'a b'}}\n", "reconcile.pages.next.param", "not a query parameter"),
        ("      pages: {next: link, every: 2}\n", "reconcile.pages.every", "unknown key"),
        ("      complete_in_one_page: true\n", "reconcile.complete_in_one_page", "in a comment"),
        ("      complete_in_one_page: yes please\n", "reconcile.complete_in_one_page", "true or false"),
        (
            "      pages: {next: link}\n      complete_in_one_page: true  # why\n",
            "reconcile.complete_in_one_page",
            "leave one of them out",
        ),
    ],
    ids=[
        "not-link",
        "max-0",
        "max-101",
        "max-word",
        "no-next",
        "no-param",
        "unknown-next-key",
        "bad-from",
        "bad-param",
        "unknown-key",
        "one-page-without-reason",
        "one-page-not-bool",
        "one-page-and-pages",
    ],
)
def test_bad_pages_name_line_and_field(tail, field, message):
    with pytest.raises(RulesError) as e:
        load_rules(BASE + tail, "blog.yaml")
    assert e.value.field is not None and e.value.field.endswith(field)
    assert message in e.value.message
    assert e.value.line is not None and e.value.line >= 15


def test_pages_need_a_list_read():
    status_only = BASE.replace('      find: {title: "{intent.post.title}", slug: "{intent.post.slug}"}\n', "")
    with pytest.raises(RulesError, match="only a read with find has pages"):
        load_rules(status_only + "      pages: {next: link}\n", "blog.yaml")


def test_link_pages_need_a_get_read():
    text = GRAPHQL.replace("pages:\n        next: {more:", "pages: {next: link}\n      #{more:")
    assert text != GRAPHQL
    with pytest.raises(RulesError, match="next page is a GET; this read is POST"):
        load_rules(text, "tracker.yaml")


@pytest.mark.parametrize(
    "tail, problems",
    [("", 1), ("      pages: {next: link}\n", 0), ("      complete_in_one_page: true  # one slug, one post\n", 0)],
    ids=["no-pages", "pages", "one-page-with-reason"],
)
def test_rules_check_refuses_absence_provable_without_pages(tmp_path, tail, problems):
    path = tmp_path / "blog.yaml"
    path.write_text(BASE + tail)
    _, found = check_rules_path(path)
    assert len(found) == problems
    if problems:
        assert found[0].field == "operations.posts.create.reconcile.absence_provable"
        assert "declares no pages" in found[0].message
        not_provable = BASE.replace("absence_provable: true", "absence_provable: false").replace(
            "      retry_when_absent: true\n", ""
        )
        path.write_text(not_provable)
        assert check_rules_path(path)[1] == []  # only a read that proves absence must say how its list ends


def page(*items, **more) -> bytes:
    return json.dumps({"data": list(items), **more}).encode()


OTHER = {"id": "p_2", "title": "Other", "slug": "other"}
FOUND = {"id": "p_9", "title": "Hello & bye", "slug": "hello-bye"}


def run(text: str, body: bytes, headers: dict | None = None, *, page_no: int = 1):
    op = load_rules(text, "blog.yaml").operations[0]
    r = receipt(INTENT)
    read = plan_read(op, r)
    assert read is not None and op.reconcile is not None
    return read, judge(op.reconcile, read, r, 200, body, headers=headers or {}, page=page_no)


def test_a_declared_cursor_names_the_next_page():
    read, v = run(PAGED, page({"id": "p_1", "title": "x", "slug": "x"}, OTHER, has_more=True))
    assert v.state is State.OUTCOME_UNKNOWN and not v.failed
    assert v.next_read is not None and "the list goes on" in v.reason
    assert v.next_read.url == read.url + "&starting_after=p_2"  # the last item's id
    # the next page replaces an earlier cursor, and keeps everything else of the read
    _, v2 = run(PAGED, page(OTHER, has_more=True))
    assert v2.next_read.url.count("starting_after=") == 1


@pytest.mark.parametrize(
    "body, state, failed, reason",
    [
        (page(OTHER, has_more=False), State.SAFE_TO_RETRY, False, "absence is proven"),
        (page(FOUND, has_more=True), State.SUCCEEDED, False, "found among 1 items"),  # found: no need to go on
        (page(OTHER), State.OUTCOME_UNKNOWN, True, "no true or false at has_more"),
        (page(has_more=True), State.OUTCOME_UNKNOWN, True, "no value at data.-1.id"),
    ],
    ids=["last-page", "found-before-the-end", "no-more-flag", "more-but-no-item"],
)
def test_judging_a_declared_cursor_page(body, state, failed, reason):
    _, v = run(PAGED, body, page_no=3)
    assert (v.state, v.failed, v.next_read) == (state, failed, None)
    assert reason in v.reason and "(page 3)" in v.reason


def test_a_link_next_names_the_next_page_on_the_same_origin_only():
    _, v = run(LINKED, page(OTHER), {"link": '<https://blog.test/v1/red/posts?page=2>; rel="next", <x>; rel="last"'})
    assert v.next_read is not None and v.next_read.url == "https://blog.test/v1/red/posts?page=2"
    _, v = run(LINKED, page(OTHER), {"link": '</v1/red/posts?page=3>; rel="next"'})
    assert v.next_read.url == "https://blog.test/v1/red/posts?page=3"
    _, v = run(LINKED, page(OTHER), {"link": '<https://evil.test/v1/red/posts?page=2>; rel="next"'})
    assert (v.state, v.failed, v.next_read) == (State.OUTCOME_UNKNOWN, True, None)
    assert "another origin" in v.reason
    _, v = run(LINKED, page(OTHER), {"link": '<https://blog.test/v1/red/posts?page=1>; rel="prev"'})
    assert v.state is State.SAFE_TO_RETRY  # no next: the list ended


@pytest.mark.parametrize(
    "body, headers, says",
    [
        (page(OTHER, has_more=True), {}, "has_more: true"),
        (page(OTHER, next_cursor="c2"), {}, "next_cursor"),
        (page(OTHER), {"link": '<https://blog.test/v1/red/posts?page=2>; rel="next"'}, 'Link rel="next"'),
    ],
    ids=["has_more", "next_cursor", "link"],
)
def test_a_list_that_says_more_without_declared_pages_proves_nothing(body, headers, says):
    _, v = run(BASE, body, headers)
    assert (v.state, v.failed, v.next_read) == (State.OUTCOME_UNKNOWN, True, None)
    assert says in v.reason and "declares no pages" in v.reason and "nothing is proven" in v.reason
    # a read that never proves absence goes to manual review, as its "not found" always does
    not_provable = BASE.replace("absence_provable: true", "absence_provable: false").replace(
        "      retry_when_absent: true\n", ""
    )
    _, v = run(not_provable, body, headers)
    assert v.state is State.MANUAL_REVIEW and says in v.reason
    _, v = run(BASE, page(OTHER, has_more=False))
    assert v.state is State.SAFE_TO_RETRY  # a list that says it ended proves absence


GRAPHQL = """\
api: tracker
hosts: [tracker.test]
post_reads: [/graphql]
operations:
  issues.create:
    match: {method: POST, path: /graphql, graphql: issueCreate}
    fingerprint: {body: [variables.input.title]}
    reconcile:
      read:
        method: POST
        url: /graphql
        body:
          query: >-
            query Q($after: String) { issues(first: 50, after: $after)
            { nodes { id title } pageInfo { hasNextPage endCursor } } }
          variables: {first: 50}
      items: data.issues.nodes
      find: {title: "{intent.variables.input.title}"}
      absence_provable: true
      retry_when_absent: true
      pages:
        next: {more: data.issues.pageInfo.hasNextPage, from: data.issues.pageInfo.endCursor, param: variables.after}
"""


def test_a_graphql_cursor_goes_in_the_body():
    op = load_rules(GRAPHQL, "tracker.yaml").operations[0]
    r = receipt({"body": {"variables.input.title": "Bug"}})
    read = plan_read(op, r)
    assert read is not None and read.body is not None and op.reconcile is not None
    body = json.dumps(
        {
            "data": {
                "issues": {
                    "nodes": [{"id": "1", "title": "Other"}],
                    "pageInfo": {"hasNextPage": True, "endCursor": "cur-2"},
                }
            }
        }
    ).encode()
    v = judge(op.reconcile, read, r, 200, body)
    assert v.next_read is not None and v.next_read.url == read.url and v.next_read.body is not None
    sent = json.loads(v.next_read.body)
    assert sent["variables"] == {"first": 50, "after": "cur-2"} and sent["query"] == json.loads(read.body)["query"]
