"""
rules/notion.yaml against a fake Notion API (version 2025-09-03: pages in a database have
the parent {data_source_id}).

The fake refuses any request without Notion-Version (400 missing_version, as Notion does),
creates pages following a per-title script ("ok", "commit_drop", "drop", "commit_504",
"http500", "conflict", "validation", "rate_limited"), and answers the data source query
(POST /v1/data_sources/{id}/query, filter title equals) and search (POST /v1/search),
neither of which may get a receipt.

Each test uses its own title and data source id.
"""

from __future__ import annotations

import re
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from proxy_addon.errors import RulesError
from proxy_addon.rules import load_rules_path
from tests.e2e.packs.harness import PACKS, PackRun, Seen, State, pack_run

PAGES = "/v1/pages"
VERSION = "2025-09-03"
TOKEN = "Bearer ntn_FAKE4242424242424242NotARealToken0000000000"
QUERY_PATH = re.compile(r"/v1/data_sources/([^/]+)/query")


def rich_text(text: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "text",
            "text": {"content": text, "link": None},
            "plain_text": text,
            "href": None,
            "annotations": {
                "bold": False,
                "italic": False,
                "strikethrough": False,
                "underline": False,
                "code": False,
                "color": "default",
            },
        }
    ]


def error(status: int, code: str, message: str):
    return status, {}, {"object": "error", "status": status, "code": code, "message": message}


class FakeNotion:
    def __init__(self) -> None:
        self.pages: list[dict[str, Any]] = []
        self.plans: dict[str, list[str]] = {}
        self.lock = threading.Lock()

    def plan(self, title: str, *steps: str) -> None:
        self.plans[title] = list(steps)

    def create(self, seen: Seen):
        if "notion-version" not in seen.headers:
            return error(400, "missing_version", "Notion-Version header failed validation")
        doc = seen.json()
        props = doc["properties"]
        title_prop = props.get("Name", props.get("title"))
        runs = title_prop["title"] if isinstance(title_prop, dict) else title_prop
        title = runs[0]["text"]["content"]
        with self.lock:
            steps = self.plans.get(title) or ["ok"]
            step = steps.pop(0) if len(steps) > 1 else steps[0]
        if step == "validation":
            return error(400, "validation_error", "body failed validation: body.parent should be defined")
        if step == "conflict":
            return error(409, "conflict_error", "Conflict occurred while saving. Please try again.")
        if step == "rate_limited":
            return error(429, "rate_limited", "You have been rate limited. Please try again in a few minutes.")
        if step == "http500":
            return error(500, "internal_server_error", "Unexpected error occurred.")
        if step == "drop":
            return 0, {}, None
        parent = doc["parent"]
        page = {
            "object": "page",
            "id": str(uuid.uuid4()),
            "created_time": "2026-11-29T21:10:00.000Z",
            "parent": {"type": next(iter(parent)), **parent},
            "in_trash": False,
            "properties": {
                ("Name" if "Name" in props else "title"): {"id": "title", "type": "title", "title": rich_text(title)}
            },
        }
        with self.lock:
            self.pages.append(page)
        if step == "commit_drop":
            return 0, {}, None
        if step == "commit_504":
            return error(504, "gateway_timeout", "Notion timed out while attempting to complete this request.")
        if step == "commit_conflict":
            return error(409, "conflict_error", "Conflict occurred while saving. Please try again.")
        if step == "commit_529":
            return error(529, "service_overload", "Notion is unavailable due to high load. Please try again later.")
        return 200, {}, page

    def query(self, seen: Seen):
        if "notion-version" not in seen.headers:
            return error(400, "missing_version", "Notion-Version header failed validation")
        ds = seen.path_match(QUERY_PATH).group(1)
        flt = seen.json().get("filter") or {}
        wanted = flt.get("title", {}).get("equals")
        with self.lock:
            results = [
                p
                for p in self.pages
                if p["parent"].get("data_source_id") == ds
                and (wanted is None or p["properties"]["Name"]["title"][0]["plain_text"] == wanted)
            ]
        return (
            200,
            {},
            {
                "object": "list",
                "results": results,
                "next_cursor": None,
                "has_more": False,
                "type": "page_or_database",
                "page_or_database": {},
            },
        )

    def search(self, seen: Seen):
        return (
            200,
            {},
            {
                "object": "list",
                "results": [],
                "next_cursor": None,
                "has_more": False,
                "type": "page_or_data_source",
                "page_or_data_source": {},
            },
        )


@pytest.fixture(scope="module")
def notion(tmp_path_factory, confdir):
    for run in pack_run(
        "notion.yaml",
        tmp_path_factory.mktemp("notion"),
        confdir,
        headers={"Authorization": TOKEN, "Notion-Version": VERSION},
    ):
        run.fake = FakeNotion()
        run.api.on("POST", PAGES, run.fake.create)
        run.api.on("POST", QUERY_PATH.pattern, run.fake.query)
        run.api.on("POST", "/v1/search", run.fake.search)
        yield run


def fresh() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return str(uuid.uuid4()), f"Q3 planning notes {tag}"


def in_data_source(ds: str, title: str) -> dict:
    return {
        "parent": {"data_source_id": ds},
        "properties": {
            "Name": {"title": [{"text": {"content": title}}]},
            "Status": {"status": {"name": "Not started"}},
        },
    }


def writes(run: PackRun, title: str) -> list[Seen]:
    return [s for s in run.api.requests("POST") if s.path == PAGES and title.encode() in s.body]


def queries(run: PackRun, ds: str) -> list[Seen]:
    return [s for s in run.api.requests("POST") if s.path == f"/v1/data_sources/{ds}/query"]


to_states = PackRun.states


receipt_count = PackRun.receipt_count


# --- outcomes of the write ---------------------------------------------------------------------


def test_a_page_in_a_data_source_succeeds_with_its_id(notion):
    ds, title = fresh()
    r = notion.send("POST", PAGES, json=in_data_source(ds, title))
    assert r.status_code == 200 and r.headers["x-receipt-state"] == "succeeded"
    receipt = notion.receipt(r)
    assert receipt.state is State.SUCCEEDED
    assert receipt.external_id == r.json()["id"] == notion.fake.pages[-1]["id"]
    # parent and properties.Name.title hold an object and a list of objects: stored as keyed hashes;
    # the leaves the rule names one by one are stored as they are (and the read uses them).
    assert receipt.intent["body"]["parent"].startswith("hmac:")
    assert receipt.intent["hashed"] == ["parent", "properties.Name.title"]
    assert receipt.intent["body"]["parent.data_source_id"] == ds
    assert receipt.intent["body"]["properties.Name.title.0.text.content"] == title
    assert len(writes(notion, title)) == 1


def test_the_same_title_in_another_data_source_is_another_intent(notion):
    ds, title = fresh()
    one = notion.send("POST", PAGES, json=in_data_source(ds, title))
    two = notion.send("POST", PAGES, json=in_data_source(str(uuid.uuid4()), title))
    assert one.headers["x-receipt-id"] != two.headers["x-receipt-id"]
    assert len(writes(notion, title)) == 2
    again = notion.send("POST", PAGES, json=in_data_source(ds, title))  # the first one again: replayed
    assert again.headers["x-receipt-id"] == one.headers["x-receipt-id"]
    assert len(writes(notion, title)) == 2


@pytest.mark.parametrize("step", ["validation", "rate_limited"])
def test_notion_refusals_are_rejected_and_a_retry_is_sent(notion, step):
    ds, title = fresh()
    notion.fake.plan(title, step, "ok")
    r = notion.send("POST", PAGES, json=in_data_source(ds, title))
    assert r.headers["x-receipt-state"] == "rejected"
    assert notion.receipt(r).state is State.REJECTED
    retry = notion.send("POST", PAGES, json=in_data_source(ds, title))
    assert retry.headers["x-receipt-state"] == "succeeded"
    assert len(writes(notion, title)) == 2


@pytest.mark.parametrize("step", ["http500", "commit_504", "commit_drop"])
def test_5xx_and_lost_connections_are_unknown(notion, step):
    ds, title = fresh()
    notion.fake.plan(title, step)
    r = notion.send("POST", PAGES, json=in_data_source(ds, title))
    assert r.headers["x-receipt-state"] == "outcome_unknown"
    assert notion.receipt(r).state is State.OUTCOME_UNKNOWN


@pytest.mark.parametrize("created", [True, False], ids=["page-created", "nothing-created"])
def test_409_conflict_error_is_not_a_refusal_the_query_decides_and_nothing_is_sent_twice(notion, created):
    """409 conflict_error ("the transaction could not be completed, potentially due to a data
    collision") does not say the page was not created (issue 16): already_exists, the data
    source query runs at once. Found → succeeded; not found → manual review (the query cannot
    prove absence). Never `rejected`, which sent the retry as a new page."""
    ds, title = fresh()
    notion.fake.plan(title, "commit_conflict" if created else "conflict", "ok")
    r = notion.send("POST", PAGES, json=in_data_source(ds, title))
    assert r.status_code == 409 and r.json()["code"] == "conflict_error"  # Notion's own answer
    receipt = notion.receipt(r)
    assert State.REJECTED not in to_states(notion, r)
    assert State.RECONCILING in to_states(notion, r)
    assert any("conflict_error" in why for _, _, why in notion.history(r))  # the pack's rule, not a default
    assert len(queries(notion, ds)) == 1
    if created:
        assert (receipt.state, receipt.external_id) == (State.SUCCEEDED, notion.fake.pages[-1]["id"])
        assert r.headers["x-receipt-state"] == "succeeded"
    else:
        assert receipt.state is State.MANUAL_REVIEW and r.headers["x-receipt-state"] == "manual_review"
    retry = notion.send("POST", PAGES, json=in_data_source(ds, title))
    assert retry.status_code == 409 and retry.headers["x-receipt-id"] == r.headers["x-receipt-id"]
    assert retry.json()["error"] == ("duplicate_succeeded" if created else "duplicate_unresolved")
    assert len(writes(notion, title)) == 1


def test_529_service_overload_is_unknown_by_the_packs_own_rule_and_never_sent_twice(notion):
    ds, title = fresh()
    notion.fake.plan(title, "commit_529")
    r = notion.send("POST", PAGES, json=in_data_source(ds, title))
    assert r.status_code == 529 and r.headers["x-receipt-state"] == "outcome_unknown"
    assert notion.receipt(r).state is State.OUTCOME_UNKNOWN
    assert any("service_overload" in why for _, _, why in notion.history(r))  # the pack says so, not a default
    retry = notion.send("POST", PAGES, json=in_data_source(ds, title))  # the page exists: the query finds it
    assert (
        retry.headers["x-receipt-state"] == "succeeded" and retry.headers["x-receipt-id"] == r.headers["x-receipt-id"]
    )
    assert len(writes(notion, title)) == 1


# --- reconcile: the data source query by title ----------------------------------------------------


def test_unknown_then_the_query_finds_the_page(notion):
    ds, title = fresh()
    notion.fake.plan(title, "commit_504", "ok")
    first = notion.send("POST", PAGES, json=in_data_source(ds, title))
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    page_id = notion.fake.pages[-1]["id"]

    retry = notion.send("POST", PAGES, json=in_data_source(ds, title))
    assert retry.headers["x-receipt-state"] == "succeeded"
    assert retry.headers["x-receipt-id"] == first.headers["x-receipt-id"]
    [read] = queries(notion, ds)
    assert read.json()["filter"] == {"property": "Name", "title": {"equals": title}}
    assert read.headers["notion-version"] == VERSION  # Notion answers 400 without it
    assert read.headers["authorization"] == TOKEN  # the retrying request's own key
    assert len(writes(notion, title)) == 1
    receipt = notion.receipt(first)
    assert receipt.state is State.SUCCEEDED and receipt.external_id == page_id
    assert to_states(notion, receipt.operation_id) == [
        State.SUBMITTED,
        State.OUTCOME_UNKNOWN,
        State.RECONCILING,
        State.SUCCEEDED,
    ]


def test_unknown_and_not_found_proves_nothing_the_retry_is_blocked(notion):
    ds, title = fresh()
    notion.fake.plan(title, "drop")
    first = notion.send("POST", PAGES, json=in_data_source(ds, title))
    assert first.headers["x-receipt-state"] == "outcome_unknown"

    retry = notion.send("POST", PAGES, json=in_data_source(ds, title))
    assert retry.status_code == 409 and retry.headers["x-receipt-state"] == "manual_review"
    assert len(queries(notion, ds)) == 1
    assert len(writes(notion, title)) == 1  # never resent on a guess
    assert notion.receipt(first).state is State.MANUAL_REVIEW


def test_a_page_under_a_page_has_no_read_and_goes_to_manual_review(notion):
    parent_page, title = fresh()
    body = {"parent": {"page_id": parent_page}, "properties": {"title": [{"text": {"content": title}}]}}
    notion.fake.plan(title, "commit_drop")
    first = notion.send("POST", PAGES, json=body)
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    before = len([s for s in notion.api.requests("POST") if s.path.endswith("/query")])

    retry = notion.send("POST", PAGES, json=body)
    assert retry.status_code == 409 and retry.headers["x-receipt-state"] == "manual_review"
    assert len([s for s in notion.api.requests("POST") if s.path.endswith("/query")]) == before
    assert len(writes(notion, title)) == 1


# --- POST reads pass through; only post_reads paths may be used by a reconcile -------------------


@pytest.mark.parametrize(
    "path, body",
    [
        pytest.param(
            "/v1/search", {"query": "Q3 planning", "filter": {"value": "page", "property": "object"}}, id="search"
        ),
        pytest.param(
            f"/v1/data_sources/{uuid.uuid4()}/query",
            {"filter": {"property": "Name", "title": {"equals": "x"}}},
            id="data-source-query",
        ),
    ],
)
def test_post_reads_pass_through_without_a_receipt(notion, path, body):
    before, seen_before = receipt_count(notion), len(notion.api.requests("POST"))
    r = notion.send("POST", path, json=body)
    assert r.status_code == 200 and r.json()["object"] == "list"
    assert "x-receipt-id" not in r.headers
    assert len(notion.api.requests("POST")) == seen_before + 1
    assert receipt_count(notion) == before


def _bad_pack(tmp_path: Path, post_reads: str) -> tuple[Path, int]:
    """rules/notion.yaml with its post_reads replaced; returns the file and the line of the read's method."""
    text = (PACKS / "notion.yaml").read_text()
    text = re.sub(r"^post_reads:\n(  - .*\n)+", post_reads, text, flags=re.MULTILINE)
    path = tmp_path / "notion.yaml"
    path.write_text(text)
    lines = text.splitlines()
    read_at = next(i for i, line in enumerate(lines) if line.strip() == "read:")
    method_line = next(i for i in range(read_at, len(lines)) if lines[i].strip() == "method: POST") + 1
    return path, method_line


@pytest.mark.parametrize(
    "post_reads",
    [
        pytest.param("post_reads: [/v1/search]\n", id="only-search-listed"),
        pytest.param("", id="no-post-reads"),
    ],
)
def test_a_post_read_to_a_path_not_in_post_reads_is_refused_when_the_rules_load(tmp_path, post_reads):
    path, line = _bad_pack(tmp_path, post_reads)
    with pytest.raises(RulesError) as info:
        load_rules_path(path)
    err = info.value
    assert (err.source, err.line, err.field) == (str(path), line, "operations.pages.create.reconcile.read.method")
    assert "post_reads" in err.message
    assert str(err).startswith(f"{path}:{line}: operations.pages.create.reconcile.read.method: ")


def test_the_shipped_pack_loads(tmp_path):
    rules = load_rules_path(PACKS / "notion.yaml")
    assert [t.template for t in rules.files[0].post_reads] == ["/v1/data_sources/{data_source_id}/query", "/v1/search"]
    reconcile = rules.operations[0].reconcile
    assert reconcile is not None and reconcile.absence_provable is False


def test_the_query_follows_next_cursor_and_finds_the_page_on_page_2(notion):
    """rules/notion.yaml `pages:`: has_more + next_cursor, sent back as the body's start_cursor."""
    ds, title = fresh()
    notion.fake.plan(title, "commit_504", "ok")
    first = notion.send("POST", PAGES, json=in_data_source(ds, title))
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    page_id = notion.fake.pages[-1]["id"]

    def paged(seen: Seen):
        if seen.json().get("start_cursor") == "cursor-2":
            return notion.fake.query(seen)
        return (
            200,
            {},
            {
                "object": "list",
                "results": [],
                "next_cursor": "cursor-2",
                "has_more": True,
                "type": "page_or_database",
                "page_or_database": {},
            },
        )

    notion.api.on("POST", f"/v1/data_sources/{ds}/query", paged, times=2)
    retry = notion.send("POST", PAGES, json=in_data_source(ds, title))
    assert retry.headers["x-receipt-state"] == "succeeded"
    one, two = queries(notion, ds)
    assert "start_cursor" not in one.json() and two.json()["start_cursor"] == "cursor-2"
    assert two.json()["filter"] == one.json()["filter"] and two.headers["notion-version"] == VERSION
    assert len(writes(notion, title)) == 1
    receipt = notion.receipt(first)
    assert receipt.state is State.SUCCEEDED and receipt.external_id == page_id
