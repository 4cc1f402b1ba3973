"""
rules/dev.to.yaml against a fake Forem (DEV) API.

The fake keeps one user's articles and enforces Forem's uniqueness of body_markdown per
user and title (422 {"error": "Body markdown has already been taken", "status": 422}).
GET /api/articles/{id} finds published articles only, as Forem's controller does; the
pack's read is GET /api/articles/me/all, which lists drafts too. Writes follow a
per-title script ("ok", "commit_drop", "drop", "http500", "blank").
"""

from __future__ import annotations

import re
import threading
import uuid
from typing import Any

import pytest

from tests.e2e.packs.harness import PackRun, Seen, State, pack_run

ARTICLES = "/api/articles"
ME_ALL = "/api/articles/me/all"
API_KEY = "FAKEdevtoKEY4242NotReal"
ONE = re.compile(r"/api/articles/(\d+)")


class FakeForem:
    def __init__(self) -> None:
        self.articles: list[dict[str, Any]] = []
        self.plans: dict[str, list[str]] = {}
        self.lock = threading.Lock()

    def plan(self, title: str, *steps: str) -> None:
        self.plans[title] = list(steps)

    def add(self, title: str, body: str, published: bool = False) -> dict[str, Any]:
        with self.lock:
            article = {
                "type_of": "article",
                "id": 1000 + len(self.articles),
                "title": title,
                "body_markdown": body,
                "published": published,
                "user_id": 7,
                "published_at": "2026-11-29T21:00:00Z" if published else None,
                "slug": f"{title.lower().replace(' ', '-')}-x1",
                "path": "/u/x1",
                "url": "https://dev.to/u/x1",
            }
            self.articles.append(article)
            return article

    def create(self, seen: Seen):
        if seen.headers.get("api-key") != API_KEY:
            return 401, {}, {"error": "unauthorized", "status": 401}
        art = seen.json()["article"]
        with self.lock:
            steps = self.plans.get(art["title"]) or ["ok"]
            step = steps.pop(0) if len(steps) > 1 else steps[0]
            taken = any(
                a["title"] == art["title"] and a["body_markdown"] == art["body_markdown"] for a in self.articles
            )
        if step == "blank":
            return 422, {}, {"error": "Title can't be blank", "status": 422}
        if step == "http500":
            return 500, {}, "<html>Internal Server Error</html>"
        if step == "drop":
            return 0, {}, None
        if taken:
            return 422, {}, {"error": "Body markdown has already been taken", "status": 422}
        article = self.add(art["title"], art["body_markdown"], art.get("published", False))
        if step == "commit_drop":
            return 0, {}, None
        return 201, {"Location": article["url"]}, article

    def me_all(self, seen: Seen):
        if seen.headers.get("api-key") != API_KEY:
            return 401, {}, {"error": "unauthorized", "status": 401}
        with self.lock:
            return 200, {}, list(reversed(self.articles))

    def show(self, seen: Seen):
        article_id = int(seen.path_match(ONE).group(1))
        with self.lock:
            found = [a for a in self.articles if a["id"] == article_id and a["published"]]
        return (200, {}, found[0]) if found else (404, {}, {"error": "not found", "status": 404})

    def update(self, seen: Seen):
        return 409, {}, {"error": "conflict", "status": 409}


@pytest.fixture(scope="module")
def devto(tmp_path_factory, confdir):
    for run in pack_run("dev.to.yaml", tmp_path_factory.mktemp("devto"), confdir, headers={"api-key": API_KEY}):
        fake = run.fake = FakeForem()
        run.api.on("POST", ARTICLES, fake.create)
        run.api.on("GET", ME_ALL, fake.me_all)
        run.api.on("GET", ONE.pattern, fake.show)
        run.api.on("PUT", ONE.pattern, fake.update)
        yield run


def fresh() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"Receipts for agents {tag}", f"# Why\n\nAgents retry. {tag}\n"


def article(title: str, body: str, published: bool = False) -> dict:
    return {"article": {"title": title, "body_markdown": body, "published": published, "tags": "ai, agents"}}


def writes(run: PackRun, title: str) -> list[Seen]:
    return [s for s in run.api.requests("POST") if s.path == ARTICLES and title.encode() in s.body]


def reads(run: PackRun) -> list[Seen]:
    return [s for s in run.api.requests("GET") if s.path.split("?")[0] == ME_ALL]


to_states = PackRun.states


# --- outcomes of the write ---------------------------------------------------------------------


def test_a_new_article_succeeds_with_its_id(devto):
    title, body = fresh()
    r = devto.send("POST", ARTICLES, json=article(title, body))
    assert r.status_code == 201 and r.headers["x-receipt-state"] == "succeeded"
    assert devto.receipt(r).external_id == str(r.json()["id"])
    assert len(writes(devto, title)) == 1


def test_a_validation_422_is_a_plain_rejection_without_a_read(devto):
    title, body = fresh()
    devto.fake.plan(title, "blank")
    reads_before = len(reads(devto))
    r = devto.send("POST", ARTICLES, json=article(title, body))
    assert r.status_code == 422 and r.headers["x-receipt-state"] == "rejected"
    assert devto.receipt(r).state is State.REJECTED
    assert len(reads(devto)) == reads_before
    assert State.RECONCILING not in to_states(devto, r.headers["x-receipt-id"])


@pytest.mark.parametrize("step", ["http500", "commit_drop", "drop"])
def test_5xx_and_lost_connections_are_unknown(devto, step):
    title, body = fresh()
    devto.fake.plan(title, step)
    r = devto.send("POST", ARTICLES, json=article(title, body))
    assert r.headers["x-receipt-state"] == "outcome_unknown"
    assert devto.receipt(r).state is State.OUTCOME_UNKNOWN


# --- "has already been taken": evidence, decided by the read --------------------------------------


def test_already_taken_goes_through_reconciling_and_ends_succeeded_with_the_existing_article(devto):
    title, body = fresh()
    existing = devto.fake.add(title, body)  # an earlier attempt whose answer was lost
    reads_before = len(reads(devto))
    r = devto.send("POST", ARTICLES, json=article(title, body))
    assert r.status_code == 422  # the agent gets Forem's answer...
    assert r.json() == {"error": "Body markdown has already been taken", "status": 422}
    assert r.headers["x-receipt-state"] == "succeeded"  # ...and the receipt's verdict
    receipt = devto.receipt(r)
    assert receipt.state is State.SUCCEEDED and receipt.external_id == str(existing["id"])
    assert State.RECONCILING in to_states(devto, receipt.operation_id)
    assert to_states(devto, receipt.operation_id)[-1] is State.SUCCEEDED
    assert len(reads(devto)) == reads_before + 1
    assert len(writes(devto, title)) == 1


def test_already_taken_but_not_in_the_list_is_proven_absent(devto):
    """The read decides, not the 422: a list without the article proves it absent."""
    title, body = fresh()
    devto.fake.add(title, body)

    def hide(seen):
        return 200, {}, []

    devto.api.on("GET", ME_ALL, hide, times=1)  # the next read sees no articles
    try:
        r = devto.send("POST", ARTICLES, json=article(title, body))
    finally:  # never leak the one-shot answer to other tests
        with devto.api.lock:
            devto.api.routes = [route for route in devto.api.routes if route.answer is not hide]
    assert r.status_code == 422
    assert devto.receipt(r).state is State.SAFE_TO_RETRY
    assert State.RECONCILING in to_states(devto, r.headers["x-receipt-id"])
    assert len(writes(devto, title)) == 1  # the proxy never resends by itself


# --- reconcile after an unknown outcome --------------------------------------------------------------


def test_unknown_then_a_draft_is_found_in_me_all(devto):
    """A draft: GET /api/articles/{id} would answer 404 (published only); /me/all lists it."""
    title, body = fresh()
    devto.fake.plan(title, "commit_drop", "ok")
    first = devto.send("POST", ARTICLES, json=article(title, body, published=False))
    draft = devto.fake.articles[-1]
    assert devto.send("GET", f"/api/articles/{draft['id']}").status_code == 404
    reads_before = len(reads(devto))

    retry = devto.send("POST", ARTICLES, json=article(title, body, published=False))
    assert retry.headers["x-receipt-state"] == "succeeded"
    new_reads = reads(devto)[reads_before:]
    assert [s.path for s in new_reads] == ["/api/articles/me/all?per_page=1000"]
    assert new_reads[0].headers["api-key"] == API_KEY
    assert len(writes(devto, title)) == 1
    assert devto.receipt(first).state is State.SUCCEEDED
    assert devto.receipt(first).external_id == str(draft["id"])


def test_unknown_then_absent_is_safe_to_retry_and_the_retry_is_sent(devto):
    title, body = fresh()
    devto.fake.plan(title, "drop", "ok")
    first = devto.send("POST", ARTICLES, json=article(title, body))
    retry = devto.send("POST", ARTICLES, json=article(title, body))
    assert retry.status_code == 201 and retry.headers["x-receipt-state"] == "succeeded"
    assert len(writes(devto, title)) == 2
    assert devto.receipt(first).state is State.SAFE_TO_RETRY
    assert devto.receipt(retry).retry_of == first.headers["x-receipt-id"]


def test_an_article_with_the_same_title_but_another_body_is_not_taken_for_it(devto):
    title, body = fresh()
    devto.fake.add(title, "a different, older article")
    devto.fake.plan(title, "drop", "ok")
    first = devto.send("POST", ARTICLES, json=article(title, body))
    devto.send("POST", ARTICLES, json=article(title, body))
    assert devto.receipt(first).state is State.SAFE_TO_RETRY  # not succeeded with the older one's id
    assert devto.receipt(first).external_id is None


def test_an_update_answered_409_may_have_been_applied_so_it_is_never_sent_again(devto):
    """A 409 to PUT /api/articles/{id} is not documented as a refusal before executing (issue 16):
    the pack no longer says `409: rejected` (which let the retry go out again), so the default
    already_exists holds, and with no read for updates the receipt goes to manual review and
    the retry is blocked: one PUT."""
    article_id = str(5000 + uuid.uuid4().int % 1000)
    path = f"/api/articles/{article_id}"
    body = {"article": {"title": f"t {uuid.uuid4().hex}"}}
    r = devto.send("PUT", path, json=body)
    assert r.status_code == 409 and r.json() == {"error": "conflict", "status": 409}  # the API's own answer
    assert r.headers["x-receipt-state"] == "manual_review"
    assert State.REJECTED not in to_states(devto, r)
    retry = devto.send("PUT", path, json=body)
    assert (retry.status_code, retry.json()["error"], retry.json()["state"]) == (
        409,
        "duplicate_unresolved",
        "manual_review",
    )
    assert retry.headers["x-receipt-id"] == r.headers["x-receipt-id"]
    assert devto.api.count("PUT", path) == 1
