"""
rules/github.yaml against a fake GitHub that answers the documented shapes: every outcome
the pack's comments claim, for each operation. Each test uses its own repository name, so
the fake's counts and the proxy's fingerprints never mix between tests.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from tests.e2e.packs.harness import PackRun, Seen, State, ours, pack_run

TOKEN = "Bearer ghp_R3c31ptPr0xyF4k3T0k3nN0tR3al0000abcd"  # the shape of a GitHub token; fake
LOGIN = "octo-bot"


@pytest.fixture(scope="module")
def gh(tmp_path_factory, confdir):
    yield from pack_run(
        "github.yaml",
        tmp_path_factory.mktemp("github"),
        confdir,
        headers={"Authorization": TOKEN, "Accept": "application/vnd.github+json"},
    )


# --- helpers -----------------------------------------------------------------------------------


history = PackRun.history


def went_through_reconciling(run: PackRun, answer, ending: str) -> list[tuple[str | None, str, str]]:
    """Assert the receipt's history holds a read (→ reconciling) that ended in `ending`."""
    steps = history(run, answer)
    pairs = [(a, b) for a, b, _ in steps]
    assert ("outcome_unknown", "reconciling") in pairs and pairs[-1] == ("reconciling", ending), steps
    return steps


def receipts(run: PackRun, target_part: str):
    store = run.store()
    try:
        return sorted((r for r in store.list(limit=None) if target_part in r.target), key=lambda r: r.submitted_at)
    finally:
        store.close()


def validation_failed(*errors: dict, doc: str = "https://docs.github.com/rest") -> dict:
    return {"message": "Validation Failed", "errors": list(errors), "documentation_url": doc}


def issue(number: int, title: str, body: str | None, repo: str, login: str = LOGIN) -> dict:
    return {
        "id": 900000 + number,
        "node_id": f"I_kw{number}",
        "number": number,
        "title": title,
        "body": body,
        "state": "open",
        "user": {"login": login, "id": 1},
        "url": f"https://api.github.com/repos/octo/{repo}/issues/{number}",
        "html_url": f"https://github.com/octo/{repo}/issues/{number}",
    }


def created_issue(number: int, repo: str):
    def answer(seen: Seen):
        body = seen.json()
        return (
            201,
            {"Location": f"https://api.github.com/repos/octo/{repo}/issues/{number}"},
            issue(number, body["title"], body.get("body"), repo),
        )

    return answer


def lose_answer(run: PackRun, path: str, body: dict):
    """The fake reads the write, then closes the connection: the outcome is unknown."""
    run.api.drop("POST", path)
    r = run.send("POST", path, json=body)
    assert r.status_code == 502
    assert r.headers["x-receipt-state"] == "outcome_unknown"
    assert run.receipt(r).state is State.OUTCOME_UNKNOWN
    return r


def query_of(seen: Seen) -> dict[str, list[str]]:
    return parse_qs(urlsplit(seen.path).query)


def gets(run: PackRun, path: str) -> list[Seen]:
    return [s for s in run.api.requests("GET") if s.path.split("?")[0] == path]


# --- issues.create -----------------------------------------------------------------------------


def test_issue_created_records_its_number(gh):
    path = "/repos/octo/issues-ok/issues"
    gh.api.on("POST", path, created_issue(4242, "issues-ok"))
    r = gh.send("POST", path, json={"title": "Nightly build failed", "body": "run 1", "labels": ["ci"]})
    assert r.status_code == 201 and r.json()["number"] == 4242
    assert r.headers["x-receipt-state"] == "succeeded"
    receipt = gh.receipt(r)
    assert (receipt.state, receipt.external_id) == (State.SUCCEEDED, "4242")
    assert receipt.intent["body"] == {"title": "Nightly build failed", "body": "run 1"}  # labels are not the intent
    assert gh.api.count("POST", path) == 1
    # The token reached GitHub; no read was needed.
    (sent,) = [s for s in gh.api.requests("POST") if s.path == path]
    assert sent.headers["authorization"] == TOKEN
    assert gets(gh, path) == []


REFUSALS = [
    # (status, headers, body, a reason the receipt's history must hold, or None)
    (401, {}, {"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"}, None),
    (
        403,
        {"retry-after": "60"},
        {
            "message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
            "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits",
        },
        "secondary limit",
    ),
    (
        403,
        {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1893456000"},
        {"message": "API rate limit exceeded for user ID 1.", "documentation_url": "https://docs.github.com/rest"},
        "primary limit",
    ),
    (429, {"retry-after": "30"}, {"message": "You have exceeded a secondary rate limit."}, "secondary limit"),
    (403, {}, {"message": "Resource not accessible by personal access token"}, None),
    (
        404,
        {},
        {"message": "Not Found", "documentation_url": "https://docs.github.com/rest/issues/issues#create-an-issue"},
        None,
    ),
    (
        410,
        {},
        {"message": "Issues are disabled for this repo", "documentation_url": "https://docs.github.com/rest"},
        None,
    ),
    (422, {}, validation_failed({"resource": "Issue", "field": "title", "code": "missing_field"}), None),
]


@pytest.mark.parametrize(
    "status, headers, body, reason",
    REFUSALS,
    ids=["401", "403-secondary", "403-primary", "429", "403-forbidden", "404", "410", "422"],
)
def test_issue_refusals_are_rejected(gh, status, headers, body, reason):
    path = f"/repos/octo/refused-{status}-{len(headers)}-{reason and reason.split()[0]}/issues"
    gh.api.on("POST", path, status, body, headers=headers)
    r = gh.send("POST", path, json={"title": f"refused {status}", "body": "x"})
    assert r.status_code == status and r.json() == body  # the agent gets GitHub's own answer
    assert r.headers["x-receipt-state"] == "rejected"
    assert gh.receipt(r).state is State.REJECTED
    if reason:
        assert any(reason in why for _, to, why in history(gh, r) if to == "rejected"), history(gh, r)
    # A rejected attempt may be sent again: it is forwarded as a new attempt.
    gh.api.on("POST", path, created_issue(5, "refused"))
    again = gh.send("POST", path, json={"title": f"refused {status}", "body": "x"})
    assert again.status_code == 201
    assert gh.receipt(again).retry_of == gh.receipt(r).operation_id
    assert gh.api.count("POST", path) == 2


@pytest.mark.parametrize("status", [500, 502, 503])
def test_issue_server_errors_are_unknown(gh, status):
    path = f"/repos/octo/server-{status}/issues"
    gh.api.on("POST", path, status, {"message": "Server Error"})
    r = gh.send("POST", path, json={"title": f"5xx {status}", "body": "x"})
    assert r.status_code == status
    assert r.headers["x-receipt-state"] == "outcome_unknown"
    assert gh.receipt(r).state is State.OUTCOME_UNKNOWN


def test_issue_lost_answer_found_by_the_read_is_succeeded(gh):
    path = "/repos/octo/issues-found/issues"
    body = {"title": "Flaky test: test_upload", "body": "seen in run 77"}
    first = lose_answer(gh, path, body)
    gh.api.on(
        "GET",
        path,
        200,
        [
            issue(12, "Something else", "other", "issues-found"),
            issue(11, body["title"], body["body"], "issues-found"),
            issue(3, body["title"], "an older issue, other body", "issues-found"),
        ],
    )
    retry = gh.send("POST", path, json=body)
    # The read found it: the retry is not sent again, and is told the outcome.
    assert retry.status_code == 409
    assert (ours(retry)["error"], ours(retry)["external_id"]) == ("duplicate_succeeded", "11")
    assert retry.headers["x-receipt-id"] == first.headers["x-receipt-id"]
    assert gh.api.count("POST", path) == 1
    (read,) = gets(gh, path)
    assert query_of(read) == {"state": ["all"], "sort": ["created"], "direction": ["desc"], "per_page": ["100"]}
    assert read.headers["authorization"] == TOKEN  # the retrying request's own token
    receipt = gh.receipt(first)
    assert (receipt.state, receipt.external_id) == (State.SUCCEEDED, "11")
    went_through_reconciling(gh, first, "succeeded")


def test_issue_5xx_then_found_answers_the_retry_with_the_outcome_not_the_5xx(gh):
    path = "/repos/octo/issues-5xx-found/issues"
    body = {"title": "Release checklist 2.4", "body": "- [ ] tag"}
    gh.api.on("POST", path, 502, {"message": "Server Error"}, times=1)
    first = gh.send("POST", path, json=body)
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    gh.api.on("GET", path, 200, [issue(8, body["title"], body["body"], "issues-5xx-found")])
    retry = gh.send("POST", path, json=body)
    assert gh.receipt(first).state is State.SUCCEEDED and gh.receipt(first).external_id == "8"
    # Not GitHub's 502 replayed as if it were the success: the outcome, with the issue number.
    assert retry.status_code == 409, (retry.status_code, retry.headers, retry.text)
    assert (ours(retry)["error"], ours(retry)["external_id"]) == ("duplicate_succeeded", "8")
    assert retry.headers["x-receipt-state"] == "succeeded" and "x-receipt-replayed" not in retry.headers
    assert gh.api.count("POST", path) == 1


def test_issue_not_found_goes_to_manual_review_and_the_retry_is_blocked(gh):
    path = "/repos/octo/issues-absent/issues"
    body = {"title": "Dependency update", "body": "bump x"}
    first = lose_answer(gh, path, body)
    gh.api.on("GET", path, 200, [issue(2, "Dependency update", "another body", "issues-absent")])
    retry = gh.send("POST", path, json=body)
    assert retry.status_code == 409
    assert (ours(retry)["error"], ours(retry)["state"]) == ("duplicate_unresolved", "manual_review")
    assert retry.headers["x-receipt-state"] == "manual_review"
    assert gh.api.count("POST", path) == 1
    assert len(gets(gh, path)) == 1
    assert gh.receipt(first).state is State.MANUAL_REVIEW
    assert "does not say this read proves absence" in history(gh, first)[-1][2]
    # A second retry is blocked too, without another read.
    assert gh.send("POST", path, json=body).status_code == 409
    assert gh.api.count("POST", path) == 1


# --- issue_comments.create ---------------------------------------------------------------------


def comment(cid: int, repo: str, number: int, body: str, origin: str) -> dict:
    return {
        "id": cid,
        "node_id": f"IC_{cid}",
        "body": body,
        "user": {"login": LOGIN},
        "issue_url": f"{origin}/repos/octo/{repo}/issues/{number}",
        "html_url": f"https://github.com/octo/{repo}/issues/{number}#issuecomment-{cid}",
    }


def test_comment_created_records_its_id(gh):
    path = "/repos/octo/comments-ok/issues/7/comments"
    gh.api.on("POST", path, 201, comment(1661, "comments-ok", 7, "LGTM", gh.api.origin))
    r = gh.send("POST", path, json={"body": "LGTM"})
    assert r.status_code == 201
    assert (gh.receipt(r).state, gh.receipt(r).external_id) == (State.SUCCEEDED, "1661")
    assert gh.receipt(r).intent["path"] == {"owner": "octo", "repo": "comments-ok", "issue_number": "7"}


def test_comment_lost_answer_found_on_its_issue_only(gh):
    repo = "comments-found"
    path = f"/repos/octo/{repo}/issues/7/comments"
    first = lose_answer(gh, path, {"body": "Build passed"})
    listing = f"/repos/octo/{repo}/issues/comments"
    # Newest first: the same text on another issue (no), then on this issue (yes).
    gh.api.on(
        "GET",
        listing,
        200,
        [
            comment(30, repo, 8, "Build passed", gh.api.origin),
            comment(29, repo, 7, "Build passed", gh.api.origin),
            comment(5, repo, 7, "Build failed", gh.api.origin),
        ],
    )
    retry = gh.send("POST", path, json={"body": "Build passed"})
    assert (retry.status_code, ours(retry)["external_id"]) == (409, "29")
    assert gh.receipt(first).state is State.SUCCEEDED
    assert gh.api.count("POST", path) == 1
    (read,) = gets(gh, listing)
    assert query_of(read) == {"sort": ["created"], "direction": ["desc"], "per_page": ["100"]}


def test_comment_not_found_goes_to_manual_review(gh):
    repo = "comments-absent"
    path = f"/repos/octo/{repo}/issues/9/comments"
    first = lose_answer(gh, path, {"body": "Deployed to staging"})
    gh.api.on(
        "GET", f"/repos/octo/{repo}/issues/comments", 200, [comment(40, repo, 10, "Deployed to staging", gh.api.origin)]
    )  # another issue
    retry = gh.send("POST", path, json={"body": "Deployed to staging"})
    assert (retry.status_code, ours(retry)["state"]) == (409, "manual_review")
    assert gh.receipt(first).state is State.MANUAL_REVIEW
    assert gh.api.count("POST", path) == 1


# --- pulls.create ------------------------------------------------------------------------------


def pull(number: int, repo: str, head: str, base: str, title: str) -> dict:
    return {
        "id": 700000 + number,
        "number": number,
        "state": "open",
        "title": title,
        "head": {"ref": head, "label": f"octo:{head}", "repo": {"full_name": f"octo/{repo}"}},
        "base": {"ref": base, "label": f"octo:{base}"},
        "html_url": f"https://github.com/octo/{repo}/pull/{number}",
    }


def test_pull_request_created_records_its_number(gh):
    path = "/repos/octo/pulls-ok/pulls"
    gh.api.on("POST", path, 201, pull(31, "pulls-ok", "feature-ok", "main", "Add feature"))
    r = gh.send("POST", path, json={"title": "Add feature", "head": "feature-ok", "base": "main", "body": "..."})
    assert r.status_code == 201
    assert (gh.receipt(r).state, gh.receipt(r).external_id) == (State.SUCCEEDED, "31")


PR_EXISTS = validation_failed(
    {"resource": "PullRequest", "code": "custom", "message": "A pull request already exists for octo:feature-dup."},
    doc="https://docs.github.com/rest/pulls/pulls#create-a-pull-request",
)


def test_pull_request_already_exists_is_reconciled_to_the_open_one(gh):
    repo = "pulls-exists"
    path = f"/repos/octo/{repo}/pulls"
    gh.api.on("POST", path, 422, PR_EXISTS)
    gh.api.on("GET", path, 200, [pull(44, repo, "feature-dup", "main", "an earlier title")])
    r = gh.send("POST", path, json={"title": "Add dup", "head": "feature-dup", "base": "main"})
    assert r.status_code == 422 and r.json() == PR_EXISTS  # the agent gets GitHub's answer...
    assert r.headers["x-receipt-state"] == "succeeded"  # ...and what the proxy made of it
    receipt = gh.receipt(r)
    assert (receipt.state, receipt.external_id) == (State.SUCCEEDED, "44")
    steps = went_through_reconciling(gh, r, "succeeded")
    # The answer itself moved it: 422 → already_exists, with the pack's reason.
    assert any(
        b == "outcome_unknown" and "open pull request for this head and base already exists" in why
        for _, b, why in steps
    ), steps
    (read,) = gets(gh, path)
    assert query_of(read) == {"state": ["open"], "head": ["octo:feature-dup"], "base": ["main"], "per_page": ["100"]}
    assert gh.api.count("POST", path) == 1


def test_pull_request_from_a_fork_already_exists_but_is_not_found_so_a_retry_meets_the_same_422(gh):
    # The pack's read only knows same-repository heads: for "user:branch" it finds nothing,
    # "proves" absence, and the retry is refused by GitHub again: no second pull request.
    repo = "pulls-fork"
    path = f"/repos/octo/{repo}/pulls"
    exists = validation_failed(
        {"resource": "PullRequest", "code": "custom", "message": "A pull request already exists for someone:patch-1."}
    )
    gh.api.on("POST", path, 422, exists)
    gh.api.on("GET", path, 200, [])
    body = {"title": "Fork fix", "head": "someone:patch-1", "base": "main"}
    r = gh.send("POST", path, json=body)
    assert (r.status_code, r.headers["x-receipt-state"]) == (422, "safe_to_retry")
    (read,) = gets(gh, path)
    assert query_of(read)["head"] == ["octo:someone:patch-1"]
    again = gh.send("POST", path, json=body)
    assert again.status_code == 422 and again.json() == exists
    assert gh.receipt(again).retry_of == gh.receipt(r).operation_id
    assert gh.api.count("POST", path) == 2


def test_pull_request_other_validation_failures_are_rejected(gh):
    path = "/repos/octo/pulls-422/pulls"
    no_commits = validation_failed(
        {"resource": "PullRequest", "code": "custom", "message": "No commits between main and feature-empty"}
    )
    gh.api.on("POST", path, 422, no_commits)
    r = gh.send("POST", path, json={"title": "Empty", "head": "feature-empty", "base": "main"})
    assert (r.status_code, r.headers["x-receipt-state"]) == (422, "rejected")
    assert gets(gh, path) == []  # no read: a plain refusal


def test_pull_request_lost_answer_proven_absent_is_sent_again(gh):
    repo = "pulls-absent"
    path = f"/repos/octo/{repo}/pulls"
    body = {"title": "Fix typo", "head": "fix-typo", "base": "main"}
    first = lose_answer(gh, path, body)
    gh.api.on("GET", path, 200, [pull(50, repo, "other-branch", "main", "Other")])
    gh.api.on("POST", path, 201, pull(51, repo, "fix-typo", "main", "Fix typo"))
    retry = gh.send("POST", path, json=body)
    assert retry.status_code == 201 and ours(retry)["number"] == 51
    assert gh.api.count("POST", path) == 2
    assert len(gets(gh, path)) == 1
    assert gh.receipt(first).state is State.SAFE_TO_RETRY
    assert "absence is proven" in history(gh, first)[-1][2]
    second = gh.receipt(retry)
    assert (second.state, second.external_id, second.retry_of) == (State.SUCCEEDED, "51", first.headers["x-receipt-id"])


def test_pull_request_lost_answer_found_open_is_succeeded(gh):
    repo = "pulls-found"
    path = f"/repos/octo/{repo}/pulls"
    body = {"title": "Bump deps", "head": "bump-deps", "base": "develop"}
    first = lose_answer(gh, path, body)
    gh.api.on("GET", path, 200, [pull(60, repo, "bump-deps", "develop", "Bump deps")])
    retry = gh.send("POST", path, json=body)
    assert (retry.status_code, ours(retry)["external_id"]) == (409, "60")
    assert gh.receipt(first).state is State.SUCCEEDED
    assert gh.api.count("POST", path) == 1


# --- releases.create ---------------------------------------------------------------------------


def release(rid: int, tag: str, draft: bool = False) -> dict:
    return {
        "id": rid,
        "tag_name": tag,
        "name": tag,
        "draft": draft,
        "prerelease": False,
        "html_url": f"https://github.com/octo/r/releases/tag/{tag}",
    }


RELEASE_EXISTS = validation_failed(
    {"resource": "Release", "code": "already_exists", "field": "tag_name"},
    doc="https://docs.github.com/rest/releases/releases#create-a-release",
)


def test_release_created_records_its_id(gh):
    path = "/repos/octo/releases-ok/releases"
    gh.api.on("POST", path, 201, release(123456, "v1.0.0"))
    r = gh.send("POST", path, json={"tag_name": "v1.0.0", "name": "1.0", "body": "notes"})
    assert (r.status_code, r.headers["x-receipt-state"]) == (201, "succeeded")
    assert gh.receipt(r).external_id == "123456"
    assert gh.receipt(r).intent["body"] == {"tag_name": "v1.0.0"}


def test_release_already_exists_is_found_in_the_list_with_drafts(gh):
    repo = "releases-exists"
    path = f"/repos/octo/{repo}/releases"
    gh.api.on("POST", path, 422, RELEASE_EXISTS)
    gh.api.on("GET", path, 200, [release(2, "v2.1.0"), release(1, "v2.0.0", draft=True)])
    r = gh.send("POST", path, json={"tag_name": "v2.0.0", "name": "2.0", "draft": True})
    assert (r.status_code, r.headers["x-receipt-state"]) == (422, "succeeded")
    assert (gh.receipt(r).state, gh.receipt(r).external_id) == (State.SUCCEEDED, "1")
    steps = went_through_reconciling(gh, r, "succeeded")
    assert any("a release for this tag already exists" in why for _, _, why in steps), steps
    (read,) = gets(gh, path)
    assert query_of(read) == {"per_page": ["100"]}  # the list, not /releases/tags/{tag} (no drafts there)


def test_release_already_exists_but_not_listed_goes_to_manual_review(gh):
    repo = "releases-exists-unlisted"
    path = f"/repos/octo/{repo}/releases"
    gh.api.on("POST", path, 422, RELEASE_EXISTS)
    gh.api.on("GET", path, 200, [release(9, "v9.0.0")])
    r = gh.send("POST", path, json={"tag_name": "v0.1.0"})
    assert r.status_code == 422
    assert gh.receipt(r).state is State.MANUAL_REVIEW
    again = gh.send("POST", path, json={"tag_name": "v0.1.0"})
    assert (again.status_code, ours(again)["state"]) == (409, "manual_review")
    assert gh.api.count("POST", path) == 1


def test_release_other_validation_failures_are_rejected(gh):
    path = "/repos/octo/releases-invalid/releases"
    gh.api.on(
        "POST", path, 422, validation_failed({"resource": "Release", "code": "invalid", "field": "target_commitish"})
    )
    r = gh.send("POST", path, json={"tag_name": "v3.0.0", "target_commitish": "nope"})
    assert (r.status_code, r.headers["x-receipt-state"]) == (422, "rejected")
    assert gets(gh, path) == []


def test_release_lost_answer_found_is_succeeded(gh):
    repo = "releases-found"
    path = f"/repos/octo/{repo}/releases"
    first = lose_answer(gh, path, {"tag_name": "v4.0.0", "draft": True})
    gh.api.on("GET", path, 200, [release(77, "v4.0.0", draft=True)])
    retry = gh.send("POST", path, json={"tag_name": "v4.0.0", "draft": True})
    assert (retry.status_code, ours(retry)["external_id"]) == (409, "77")
    assert gh.api.count("POST", path) == 1
    receipt = gh.receipt(first)
    assert (receipt.state, receipt.external_id) == (State.SUCCEEDED, "77")


# --- gists.create ------------------------------------------------------------------------------


def test_gist_created_records_its_id(gh):
    gist = {"description": "repro for #12", "public": False, "files": {"repro.py": {"content": "print(1)"}}}
    gh.api.on(
        "POST",
        "/gists",
        201,
        {
            "id": "aa5a315d61ae9438b18d",
            "description": gist["description"],
            "files": {"repro.py": {"filename": "repro.py", "size": 8}},
        },
    )
    r = gh.send("POST", "/gists", json=gist)
    assert (r.status_code, gh.receipt(r).external_id) == (201, "aa5a315d61ae9438b18d")
    # Same description, other file: another gist, not a duplicate.
    gh.api.on("POST", "/gists", 201, {"id": "bb5a315d61ae9438b18d", "description": gist["description"], "files": {}})
    other = gh.send("POST", "/gists", json={**gist, "files": {"repro.py": {"content": "print(2)"}}})
    assert other.status_code == 201 and "x-receipt-replayed" not in other.headers
    assert gh.api.count("POST", "/gists") == 2


def test_gist_lost_answer_not_listed_goes_to_manual_review(gh):
    gist = {"description": "lost gist", "public": True, "files": {"a.txt": {"content": "a"}}}
    before = gh.api.count("POST", "/gists")
    gh.api.drop("POST", "/gists")
    first = gh.send("POST", "/gists", json=gist)
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    gh.api.on("GET", "/gists", 200, [{"id": "cc", "description": "another gist", "files": {}}])
    retry = gh.send("POST", "/gists", json=gist)
    assert (retry.status_code, ours(retry)["state"]) == (409, "manual_review")
    assert gh.api.count("POST", "/gists") == before + 1
    (read,) = [s for s in gh.api.requests("GET") if s.path.startswith("/gists")]
    assert query_of(read) == {"per_page": ["100"]} and read.headers["authorization"] == TOKEN


def test_the_token_never_reaches_the_receipts_database(gh):
    """Every test above sent the token; the store keeps only a keyed hash of it."""
    assert gh.api.requests("POST"), "run with the other tests of this module"
    db = gh.proxy.db
    stored = b"".join(p.read_bytes() for p in (db, db.with_name(db.name + "-wal")) if p.exists())
    assert TOKEN.split()[1].encode() not in stored


# --- pulls.create: the read follows Link rel="next" (issue 16) -------------------------------------


@pytest.mark.parametrize("ending", ["on-page-2", "never"])
def test_pull_request_lost_answer_then_a_full_page_with_a_next_link_makes_no_second_write(gh, ending):
    """The pack declares `pages: {next: link, max: 5}`: a dropped answer, then a read whose
    first page (100 other pull requests, a Link rel="next") lacks the attempt's own. Found on
    page 2 → succeeded; a Link chain past pages.max (5) → not proven, the retry is blocked.
    Never a second pull request. (Without `pages` in the pack, page 1's next link proves nothing:
    the page-2 case fails.)"""
    repo = f"pulls-paged-{ending}"
    path = f"/repos/octo/{repo}/pulls"
    body = {"title": f"Paged {ending}", "head": f"paged-{ending}", "base": "main"}
    first = lose_answer(gh, path, body)
    mine = pull(5000, repo, body["head"], body["base"], body["title"])

    def page(seen: Seen):
        number = int(query_of(seen).get("page", ["1"])[0])
        if ending == "on-page-2" and number == 2:
            return 200, {}, [mine]  # the last page: no Link next
        others = [pull(number * 1000 + i, repo, f"other-{number}-{i}", "main", "Other") for i in range(100)]
        nxt = f"{gh.api.origin}{path}?state=open&per_page=100&page={number + 1}"
        return 200, {"Link": f'<{nxt}>; rel="next", <{gh.api.origin}{path}?page=99>; rel="last"'}, others

    gh.api.on("GET", path, page, times=2 if ending == "on-page-2" else 5)
    gh.api.on("POST", path, 201, pull(5001, repo, body["head"], body["base"], body["title"]))  # a second one, if sent
    retry = gh.send("POST", path, json=body)
    walked = gets(gh, path)
    receipt = gh.receipt(first)
    assert gh.api.count("POST", path) == 1  # no second write
    if ending == "on-page-2":
        assert (retry.status_code, ours(retry)["error"], ours(retry)["external_id"]) == (
            409,
            "duplicate_succeeded",
            "5000",
        )
        assert (receipt.state, receipt.external_id) == (State.SUCCEEDED, "5000")
        assert len(walked) == 2
        assert query_of(walked[1])["page"] == ["2"]
        assert walked[1].headers["authorization"] == TOKEN  # every page with the request's token
        went_through_reconciling(gh, first, "succeeded")
    else:
        assert (retry.status_code, ours(retry)["error"]) == (409, "duplicate_unresolved")
        assert receipt.state is State.OUTCOME_UNKNOWN
        assert len(walked) == 5  # pages.max
        assert "past pages.max (5 pages)" in history(gh, first)[-1][2]
