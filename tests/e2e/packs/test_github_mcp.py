"""
rules/github-mcp.yaml against a fake of GitHub's MCP server (tests/e2e/packs/github_mcp_server.py:
the SDK's MCPServer serving the published tools, names, input schemas and annotations, and
answering in the real server's shapes and error texts), with the SDK's own client
(tests/e2e/mcp/client.py) through a real mitmdump loaded with the pack, in both protocol revisions.

The pack is copied as shipped, its `hosts:` pointed at 127.0.0.1 (the fake serves the pack's
path, /mcp/). For each operation, one client session (per revision) runs every scenario in
turn, each with its own arguments, and the tests read what happened from it:
- ok:       a success, then the identical call → one effect, the retry replayed;
- drop:     the effect made, the answer cut, then the identical call → the pack's reconcile read
            (through its read tool, in a session of its own, with the caller's credentials)
            finds it: succeeded, the retry answered without a second effect; files.put has no
            read: the retry is blocked;
- refused:  a tool error naming a GitHub 4xx → rejected, and the retry is sent (and succeeds);
- unknown:  a tool error naming a GitHub 5xx → outcome_unknown, the retry never makes a second
            effect (blocked; for pulls.create, whose 502 came after GitHub acted, the read finds
            the pull request).
And issue_write with method update is not issues.create: it passes, with no receipt.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy_addon.store import Receipt, Store
from tests.conftest import ROOT, SECRETS
from tests.e2e.mcp.client import REVISIONS, run_client
from tests.e2e.packs.github_mcp_tools import ERRORS
from tests.e2e.processes import Proxy, stop_process, until_ready

TOKEN = SECRETS["authorization"]  # a marker secret: the session-wide sweep checks it never reaches a DB or a log
READY = re.compile(r"github_mcp_server: ready (http://127\.0\.0\.1:(\d+)/mcp/)")
SCENARIOS = ("ok", "drop", "refused", "unknown")


class FakeGitHubMCP:
    """`python -m tests.e2e.packs.github_mcp_server --port 0` as a subprocess, stopped by its PID."""

    def __init__(self, workdir: Path):
        self.log_path = workdir / "github-mcp-server.log"
        self.proc: subprocess.Popen | None = None
        self.url = self.base = ""

    def start(self) -> FakeGitHubMCP:
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.e2e.packs.github_mcp_server", "--port", "0"],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

        def ready():
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the fake exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            return READY.search(self.log_path.read_text(errors="replace"))

        self.url = until_ready(self.proc, self.log_path, ready, "the fake GitHub MCP server to listen").group(1)
        self.base = self.url.removesuffix("/mcp/")
        return self

    def stop(self) -> None:
        stop_process(self.proc)

    def _control(self, method: str, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10) as r:
            return json.loads(r.read())

    def effects(self) -> dict[str, Any]:
        return self._control("GET", "/_effects")

    def fault(self, tool: str, when: dict[str, Any], **fault: Any) -> None:
        self._control("POST", "/_faults", {"tool": tool, "when": when, "fault": fault})


@dataclass(frozen=True)
class Op:
    """One operation of the pack: its tool, the arguments of a scenario, and what the fake does."""

    operation: str
    tool: str
    key: str  # the argument that tells the scenarios apart (it is in the fingerprint)
    refused_status: int  # a GitHub 4xx the pack calls a refusal
    effects: str  # the fake's list the effect goes to
    read: str | None  # the pack's reconcile read tool
    commit_on_5xx: bool  # the 5xx came after GitHub acted
    extra: tuple[tuple[str, Any], ...] = ()

    def arguments(self, tag: str, scenario: str) -> dict[str, Any]:
        value = {
            "title": f"Build broke {tag} {scenario}",
            "body": f"Fixed in {tag} {scenario}",
            "head": f"fix-{tag}-{scenario}",
            "path": f"docs/{tag}-{scenario}.md",
        }[self.key]
        return {"owner": "octo", "repo": "hello", **dict(self.extra), self.key: value}


OPS = {
    "issues.create": Op(
        "issues.create",
        "issue_write",
        "title",
        422,
        "issues",
        "list_issues",
        False,
        (("method", "create"), ("body", "on main")),
    ),
    "issues.create_granular": Op(
        "issues.create_granular", "create_issue", "title", 410, "issues", "list_issues", False, (("body", "on main"),)
    ),
    "issue_comments.create": Op(
        "issue_comments.create",
        "add_issue_comment",
        "body",
        404,
        "comments",
        "issue_read",
        False,
        (("issue_number", 42),),
    ),
    "pulls.create": Op(
        "pulls.create",
        "create_pull_request",
        "head",
        422,
        "pulls",
        "list_pull_requests",
        True,
        (("title", "Fix the build"), ("base", "main")),
    ),
    "files.put": Op(
        "files.put",
        "create_or_update_file",
        "path",
        403,
        "files",
        None,
        True,
        (("branch", "main"), ("content", "hello\n"), ("message", "Add a doc")),
    ),
}


@dataclass
class Run:
    """One client session that ran every scenario of an operation twice in a row."""

    op: Op
    tag: str
    report: dict[str, Any]
    effects: dict[str, Any]
    proxy: Proxy
    new_calls: list[dict]  # the tools/call requests the fake got during this run

    def results(self, scenario: str) -> tuple[dict, dict]:
        i = 2 * SCENARIOS.index(scenario)
        first, retry = self.report["results"][i : i + 2]
        return first, retry

    def value(self, scenario: str) -> Any:
        return self.op.arguments(self.tag, scenario)[self.op.key]

    def made(self, scenario: str) -> list[dict]:
        """The effects the fake recorded for this scenario."""

        def key(e: dict) -> Any:
            return e["head"]["ref"] if self.op.key == "head" else e.get(self.op.key)

        return [e for e in self.effects[self.op.effects] if key(e) == self.value(scenario)]

    def calls(self, scenario: str | None = None, tool: str | None = None) -> list[dict]:
        """The tools/call requests that reached the fake: of the write (of a scenario), or of `tool`."""
        if tool is not None:
            return [c for c in self.effects["calls"] if c["tool"] == tool and self.tag in json.dumps(c["arguments"])]
        assert scenario is not None, "the write's calls are those of a scenario"
        return [
            c
            for c in self.effects["calls"]
            if c["tool"] == self.op.tool and c["arguments"].get(self.op.key) == self.value(scenario)
        ]

    def receipts(self, scenario: str) -> list[Receipt]:
        store = Store.open(self.proxy.db, create=False)
        try:
            found = [r for r in store.list(limit=None) if json.dumps(self.value(scenario)) in json.dumps(r.intent)]
            return sorted(found, key=lambda r: r.submitted_at)
        finally:
            store.close()

    def history(self, receipt: Receipt) -> list[tuple[str, str]]:
        store = Store.open(self.proxy.db, create=False)
        try:
            return [(e.event, str(e.to_state)) for e in store.events(receipt.operation_id)]
        finally:
            store.close()


def text(result: dict) -> str:
    return "".join(c.get("text", "") for c in result.get("content") or [])


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    server = FakeGitHubMCP(tmp_path_factory.mktemp("github-mcp-fake")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, confdir):
    """A mitmdump with the pack as shipped, but for its hosts (127.0.0.1: the fake)."""
    workdir = tmp_path_factory.mktemp("github-mcp-proxy")
    rules = workdir / "rules"
    rules.mkdir()
    pack = (ROOT / "rules" / "github-mcp.yaml").read_text()
    pointed = pack.replace("hosts: [api.githubcopilot.com]", 'hosts: ["127.0.0.1"]')
    assert pointed != pack and "api.githubcopilot.com]" not in pointed
    (rules / "github-mcp.yaml").write_text(pointed)
    p = Proxy(workdir, confdir, rules=rules).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def runs(fake, proxy):
    """run(operation, revision): the operation's scenarios in one client session (run once, then kept)."""
    done: dict[tuple[str, str], Run] = {}

    def run(operation: str, revision: str) -> Run:
        if (operation, revision) in done:
            return done[(operation, revision)]
        op, tag = OPS[operation], uuid.uuid4().hex[:8]
        before = len(fake.effects()["calls"])
        value = {s: op.arguments(tag, s)[op.key] for s in SCENARIOS}
        fake.fault(op.tool, {op.key: value["drop"]}, kind="drop")
        fake.fault(op.tool, {op.key: value["refused"]}, kind="github", status=op.refused_status)
        fake.fault(op.tool, {op.key: value["unknown"]}, kind="github", status=502, commit=op.commit_on_5xx)
        plan = [("call", op.tool, op.arguments(tag, s)) for s in SCENARIOS for _ in (1, 2)]
        report = run_client(
            fake.url,
            plan,
            revision=revision,
            proxy=proxy.url,
            ca=proxy.ca,
            timeout=8.0,
            headers={"Authorization": TOKEN},
        )
        assert "connect_error" not in report, report
        assert all(r["ok"] for r in report["results"]), report["results"]
        effects = fake.effects()
        done[(operation, revision)] = Run(op, tag, report, effects, proxy, effects["calls"][before:])
        return done[(operation, revision)]

    return run


each = pytest.mark.parametrize("revision", REVISIONS)
every_op = pytest.mark.parametrize("operation", list(OPS))


@every_op
@each
def test_a_success_then_the_identical_call_is_replayed(runs, operation, revision):
    run = runs(operation, revision)
    first, retry = run.results("ok")
    assert not first["is_error"], first
    created = json.loads(text(first))
    assert not retry["is_error"] and retry["content"] == first["content"], retry  # the recorded result, its own id
    assert len(run.calls("ok")) == 1 and len(run.made("ok")) == 1, "one effect: the retry never reached GitHub"
    [receipt] = run.receipts("ok")
    assert (receipt.api, receipt.operation, receipt.state) == ("github-mcp", operation, "succeeded")
    assert "replayed" in [e for e, _ in run.history(receipt)]
    expected = created["commit"]["sha"] if operation == "files.put" else created["url"]
    assert receipt.external_id == expected


@every_op
@each
def test_a_lost_answer_is_settled_by_the_packs_read_or_blocked(runs, operation, revision):
    run = runs(operation, revision)
    first, retry = run.results("drop")
    assert first["is_error"] and "answer was lost" in text(first), first
    assert len(run.calls("drop")) == 1 and len(run.made("drop")) == 1, "the retry made no second effect"
    [receipt] = run.receipts("drop")
    steps = [s for e, s in run.history(receipt) if e == "transition"]
    if run.op.read is None:  # files.put: no read can prove the commit: blocked until an operator decides
        assert receipt.state == "outcome_unknown", steps
        assert retry["is_error"] and text(retry).startswith("NOT SENT") and receipt.operation_id in text(retry)
        return
    assert steps[-3:] == ["outcome_unknown", "reconciling", "succeeded"], steps
    assert receipt.state == "succeeded" and receipt.external_id, receipt
    assert retry["is_error"] and "already succeeded" in text(retry), retry
    # The read went through the pack's read tool, with the duplicate's own credentials.
    reads = [c for c in run.new_calls if c["tool"] == run.op.read]
    assert reads and all(c["authorization"] == TOKEN for c in reads), run.new_calls


@every_op
@each
def test_a_github_4xx_is_a_refusal_and_the_retry_is_sent(runs, operation, revision):
    run = runs(operation, revision)
    first, retry = run.results("refused")
    assert first["is_error"] and f": {run.op.refused_status} " in text(first), first  # the server's own text
    assert not retry["is_error"], retry
    assert len(run.calls("refused")) == 2 and len(run.made("refused")) == 1
    assert [r.state for r in run.receipts("refused")] == ["rejected", "succeeded"]


@every_op
@each
def test_a_github_5xx_is_unknown_and_the_retry_makes_no_second_effect(runs, operation, revision):
    run = runs(operation, revision)
    first, retry = run.results("unknown")
    assert first["is_error"] and ": 502 " in text(first), first
    assert len(run.calls("unknown")) == 1, "the retry was never sent"
    assert len(run.made("unknown")) == (1 if run.op.commit_on_5xx else 0)
    [receipt] = run.receipts("unknown")
    steps = [s for e, s in run.history(receipt) if e == "transition"]
    assert steps[:2] == ["submitted", "outcome_unknown"] or "outcome_unknown" in steps[:3], steps
    if run.op.read is not None and run.op.commit_on_5xx:  # pulls.create: the read finds what GitHub made
        assert receipt.state == "succeeded" and "already succeeded" in text(retry), steps
        return
    if run.op.read is None:  # files.put: nothing to read: blocked as it is
        assert receipt.state == "outcome_unknown", steps
    else:  # the read did not find it, and one page of a list proves no absence: an operator decides
        assert steps[-3:] == ["outcome_unknown", "reconciling", "manual_review"], steps
    assert retry["is_error"] and text(retry).startswith("NOT SENT") and receipt.operation_id in text(retry), retry


@each
def test_issue_write_update_is_not_a_create(fake, proxy, revision):
    tag = uuid.uuid4().hex[:8]
    update = {"method": "update", "owner": "octo", "repo": "hello", "issue_number": 42, "title": f"Renamed {tag}"}
    report = run_client(
        fake.url,
        [("call", "issue_write", update)] * 2,
        revision=revision,
        proxy=proxy.url,
        ca=proxy.ca,
        headers={"Authorization": TOKEN},
    )
    assert all(r["ok"] and not r["is_error"] for r in report["results"]), report
    assert len([u for u in fake.effects()["updates"] if u.get("title") == update["title"]]) == 2, "both passed"
    store = Store.open(proxy.db, create=False)
    try:
        assert not [r for r in store.list(limit=None) if tag in json.dumps(r.intent)], "no receipt for an update"
    finally:
        store.close()


@each
def test_a_toolset_url_is_the_same_endpoint(fake, proxy, revision):
    """A client given /mcp/x/issues (GitHub's toolset URL) gets receipts; the same call at /mcp/ is its duplicate."""
    tag = uuid.uuid4().hex[:8]
    create = {"method": "create", "owner": "octo", "repo": "hello", "title": f"Toolset {tag}", "body": "on main"}
    plan = [("call", "issue_write", create)] * 2
    at_toolset = run_client(
        f"{fake.base}/mcp/x/issues",
        plan,
        revision=revision,
        proxy=proxy.url,
        ca=proxy.ca,
        headers={"Authorization": TOKEN},
    )
    at_root = run_client(
        fake.url, plan[:1], revision=revision, proxy=proxy.url, ca=proxy.ca, headers={"Authorization": TOKEN}
    )
    results = at_toolset["results"] + at_root["results"]
    assert all(r["ok"] and not r["is_error"] for r in results), (at_toolset, at_root)
    assert len([i for i in fake.effects()["issues"] if i.get("title") == create["title"]]) == 1, "one issue"
    store = Store.open(proxy.db, create=False)
    try:
        mine = [r for r in store.list(limit=None) if tag in json.dumps(r.intent)]
        assert len(mine) == 1 and mine[0].state == "succeeded" and "/mcp/x/issues" in mine[0].target, mine
        replays = [e for e in store.events(mine[0].operation_id) if e.event == "replayed"]
        assert len(replays) == 2, "the second call at the toolset URL and the call at /mcp/ were replayed"
    finally:
        store.close()


@pytest.fixture(scope="module")
def reactions(fake, proxy):
    """add_issue_comment with reactions, in one client session: a reaction to each of two comments of one
    issue (comment_id, as the newer server takes it), then a comment and a reaction whose reaction fails,
    in each order the server's versions use (the comment first, @009bb7b5; the reaction first, @03d3cfd1),
    each followed by the identical call."""
    tag = uuid.uuid4().hex[:8]
    base: dict[str, Any] = {"owner": "octo", "repo": f"reactions-{tag}", "issue_number": 7}
    on_comments = [{**base, "comment_id": 501, "reaction": "+1"}, {**base, "comment_id": 502, "reaction": "+1"}]
    comment_first = {**base, "body": f"Thanks {tag} (comment first)", "reaction": "heart"}
    reaction_first = {**base, "body": f"Thanks {tag} (reaction first)", "reaction": "heart"}
    fake.fault("add_issue_comment", {"body": comment_first["body"]}, kind="reaction_fails", comment_first=True)
    fake.fault("add_issue_comment", {"body": reaction_first["body"]}, kind="reaction_fails", comment_first=False)
    plan = [
        ("call", "add_issue_comment", a)
        for a in (*on_comments, comment_first, comment_first, reaction_first, reaction_first)
    ]
    report = run_client(
        fake.url,
        plan,
        revision="2026-07-28",
        proxy=proxy.url,
        ca=proxy.ca,
        timeout=8.0,
        headers={"Authorization": TOKEN},
    )
    assert "connect_error" not in report and all(r["ok"] for r in report["results"]), report
    effects = fake.effects()
    store = Store.open(proxy.db, create=False)
    try:
        mine = [r for r in store.list(limit=None) if base["repo"] in json.dumps(r.intent)]
        history = {
            r.operation_id: [str(e.to_state) for e in store.events(r.operation_id) if e.event == "transition"]
            for r in mine
        }
    finally:
        store.close()
    return {
        "tag": tag,
        "repo": base["repo"],
        "report": report,
        "effects": effects,
        "receipts": mine,
        "history": history,
        "comment_first": comment_first["body"],
        "reaction_first": reaction_first["body"],
    }


def test_a_reaction_to_another_comment_is_another_write(reactions):
    one, two = reactions["report"]["results"][:2]
    assert not one["is_error"] and not two["is_error"], (one, two)
    made = [r for r in reactions["effects"]["reactions"] if r["repo"] == reactions["repo"] and r["comment_id"]]
    assert sorted(r["comment_id"] for r in made) == [501, 502], "the second reaction was not replayed from the first"


@pytest.mark.parametrize("order", ["comment_first", "reaction_first"])
def test_a_failed_reaction_leaves_the_comment_to_the_read(reactions, order):
    i = 2 if order == "comment_first" else 4
    first, retry = reactions["report"]["results"][i : i + 2]
    body = reactions[order]
    assert first["is_error"] and "failed to add reaction to issue: POST " in text(first), first
    comments = [c for c in reactions["effects"]["comments"] if c["body"] == body]
    assert len([c for c in reactions["effects"]["calls"] if c["arguments"].get("body") == body]) == 1, "retry not sent"
    [receipt] = [r for r in reactions["receipts"] if body in json.dumps(r.intent)]
    steps = reactions["history"][receipt.operation_id]
    if order == "comment_first":  # the comment exists: the read finds it
        assert len(comments) == 1 and steps[-3:] == ["outcome_unknown", "reconciling", "succeeded"], steps
        assert "already succeeded" in text(retry)
    else:  # the reaction failed before any comment: the read finds none, and cannot prove it: an operator decides
        assert comments == [] and steps[-3:] == ["outcome_unknown", "reconciling", "manual_review"], steps
        assert retry["is_error"] and text(retry).startswith("NOT SENT")


@pytest.fixture(scope="module")
def edges(fake, proxy):
    """The pack's other claims, in one client session (2026-07-28): a second pull request for the same
    branches (GitHub's "A pull request already exists"), a file overwritten without its sha (the JSON
    after a warning), a stale sha, and the MCP App form shown instead of acting."""
    tag = uuid.uuid4().hex[:8]
    repo = {"owner": "octo", "repo": f"edges-{tag}"}
    pr = {**repo, "head": f"fix-{tag}", "base": "main"}
    file = {**repo, "branch": "main", "path": f"docs/{tag}.md", "message": "Update the doc"}
    form = {**repo, "method": "create", "title": f"Form {tag}", "body": "from the form"}
    fake.fault("issue_write", {"title": form["title"]}, kind="text", text=ERRORS["issue_form"])
    bodyless = {**repo, "method": "create", "title": f"No body {tag}"}
    fake.fault("issue_write", {"title": bodyless["title"]}, kind="drop")
    calls = {
        "pr_a": {**pr, "title": "Fix it (A)"},
        "pr_b": {**pr, "title": "Fix it (B)"},
        "file_1": {**file, "content": "one\n"},
        "file_2": {**file, "content": "two\n"},
        "file_3": {**file, "content": "three\n", "sha": "a" * 40},
    }
    plan = [
        ("call", "create_pull_request", calls["pr_a"]),
        ("call", "create_pull_request", calls["pr_b"]),
        ("call", "create_pull_request", calls["pr_b"]),
        ("call", "create_or_update_file", calls["file_1"]),
        ("call", "create_or_update_file", calls["file_2"]),
        ("call", "create_or_update_file", calls["file_2"]),
        ("call", "create_or_update_file", calls["file_3"]),
        ("call", "create_or_update_file", calls["file_3"]),
        ("call", "issue_write", form),
        ("call", "issue_write", form),
        ("call", "issue_write", bodyless),
        ("call", "issue_write", bodyless),
    ]
    report = run_client(
        fake.url,
        plan,
        revision="2026-07-28",
        proxy=proxy.url,
        ca=proxy.ca,
        timeout=8.0,
        headers={"Authorization": TOKEN},
    )
    assert "connect_error" not in report and all(r["ok"] for r in report["results"]), report
    results = dict(
        zip(
            (
                "pr_a",
                "pr_b",
                "pr_b_retry",
                "file_1",
                "file_2",
                "file_2_retry",
                "file_3",
                "file_3_retry",
                "form",
                "form_retry",
                "bodyless",
                "bodyless_retry",
            ),
            report["results"],
            strict=True,
        )
    )
    store = Store.open(proxy.db, create=False)
    try:
        mine = sorted(
            (r for r in store.list(limit=None) if repo["repo"] in json.dumps(r.intent)), key=lambda r: r.submitted_at
        )
        history = {
            r.operation_id: [str(e.to_state) for e in store.events(r.operation_id) if e.event == "transition"]
            for r in mine
        }
    finally:
        store.close()
    effects = fake.effects()
    sent = [c for c in effects["calls"] if c["arguments"].get("repo") == repo["repo"]]
    return {
        "results": results,
        "receipts": mine,
        "history": history,
        "effects": effects,
        "sent": sent,
        "repo": repo["repo"],
        "calls": calls,
        "form": form,
        "bodyless": bodyless,
    }


def test_a_second_pull_request_for_the_same_branches_is_settled_by_the_read(edges):
    res, repo = edges["results"], edges["repo"]
    assert not res["pr_a"]["is_error"]
    assert res["pr_b"]["is_error"] and "A pull request already exists for octo:" in text(res["pr_b"])
    assert len([p for p in edges["effects"]["pulls"] if p["repo"] == repo]) == 1
    [b] = [r for r in edges["receipts"] if "Fix it (B)" in json.dumps(r.intent)]
    # GitHub's 422 is evidence the pull request exists (maybe this call's own): the retry reads, finds it.
    assert edges["history"][b.operation_id][-3:] == ["outcome_unknown", "reconciling", "succeeded"]
    assert "already succeeded" in text(res["pr_b_retry"])
    assert len([c for c in edges["sent"] if c["tool"] == "create_pull_request"]) == 2, "the retry was not sent"


def test_a_file_overwritten_without_its_sha_is_a_success_replayed(edges):
    res = edges["results"]
    said = text(res["file_2"])
    assert not res["file_2"]["is_error"] and said.startswith("Warning: File updated without SHA validation")
    [two] = [r for r in edges["receipts"] if "two" in json.dumps(r.intent) and r.operation == "files.put"]
    assert two.state == "succeeded"
    assert two.external_id is None  # the text is not JSON: the commit sha stays unread (the pack says so)
    assert not res["file_2_retry"]["is_error"] and res["file_2_retry"]["content"] == res["file_2"]["content"]
    puts = [c for c in edges["sent"] if c["tool"] == "create_or_update_file"]
    assert [c["arguments"]["content"] for c in puts] == ["one\n", "two\n", "three\n"], "the replay was not sent"


def test_a_stale_sha_is_unknown_and_the_retry_blocked(edges):
    res = edges["results"]
    assert res["file_3"]["is_error"] and text(res["file_3"]).startswith("SHA mismatch: provided SHA")
    [three] = [r for r in edges["receipts"] if "three" in json.dumps(r.intent)]
    assert three.state == "outcome_unknown"  # maybe changed by this very write's first attempt: never a refusal
    assert text(res["file_3_retry"]).startswith("NOT SENT") and three.operation_id in text(res["file_3_retry"])
    assert not [f for f in edges["effects"]["files"] if f["content"] == "three\n"]


def test_the_mcp_app_form_is_a_refusal_and_the_retry_is_sent(edges):
    res, title = edges["results"], edges["form"]["title"]
    assert res["form"]["is_error"] and "has NOT been created yet" in text(res["form"])
    assert not res["form_retry"]["is_error"]
    assert [r.state for r in edges["receipts"] if title in json.dumps(r.intent)] == ["rejected", "succeeded"]
    assert len([i for i in edges["effects"]["issues"] if i["title"] == title]) == 1


def test_a_lost_issue_without_a_body_goes_to_manual_review(edges):
    """The read finds by title and body: an issue sent without `body` has none to look for (the pack says so)."""
    res, title = edges["results"], edges["bodyless"]["title"]
    assert res["bodyless"]["is_error"] and "answer was lost" in text(res["bodyless"])
    [receipt] = [r for r in edges["receipts"] if title in json.dumps(r.intent)]
    assert edges["history"][receipt.operation_id][-3:] == ["outcome_unknown", "reconciling", "manual_review"]
    assert text(res["bodyless_retry"]).startswith("NOT SENT")
    assert len([i for i in edges["effects"]["issues"] if i["title"] == title]) == 1
