"""
MCP tool calls whose first answer is not their outcome (issue 25, items 1 and 3), with real parts:
the official SDK's server (tests/e2e/mcp/server.py; its tasks on the SDK's extension interfaces,
tests/e2e/mcp/tasks.py) and client (tests/e2e/mcp/client.py), in both revisions and both response modes
where the revision has them, through a real mitmdump with the receipts addon.

- A tool that asks the user to confirm (elicitation): in 2026-07-28 the server answers
  `input_required` and the client sends the same call again with `requestState`/`inputResponses`:
  one receipt, in flight across the rounds, decided by the last answer; the user is asked once, the
  issue made once, and an identical call afterwards is replayed the final result. A new identical
  call while the first waits for input is refused at once; a server that keeps asking is stopped
  at receipts_mcp_rounds (outcome_unknown); a proxy restarted meanwhile lets the call go on. In
  2025-11-25 the question travels on the call's own event stream: one receipt, one issue.
- A tool the server runs as a task (2026-07-28 `resultType: task`, 2025-11-25 task-augmented calls):
  the receipt waits for the task; its end (read as the client polls, or by the proxy itself when a
  retry comes) decides it: completed → succeeded and replayable; failed after acting → unknown,
  the retry blocked; refused for its parameters → rejected, the retry sent; cancelled → unknown;
  still working → the retry refused with the task's id.
Each test counts what the server did, and checks the receipt's state and events, and what the client got.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

from proxy_addon.store import Receipt, Store
from proxy_addon.wire.jsonrpc import messages_of
from tests.conftest import recorded_answer, wait_for
from tests.e2e.mcp.client import run_client
from tests.e2e.processes import Proxy

ROUNDS = 2  # receipts_mcp_rounds of the proxy here (the SDK client's own bound is 10)

RULES = """\
api: tracker
hosts: ["127.0.0.1"]
operations:
  issues.confirmed:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue_confirmed}}
    fingerprint: {body: [params.arguments.title, params.arguments.body]}
    external_id: number
  issues.insist:
    match: {method: POST, path: /mcp, mcp: {tool: ask_forever}}
    fingerprint: {body: [params.arguments.title]}
  issues.later:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue_later}}
    fingerprint: {body: [params.arguments.title, params.arguments.body]}
    external_id: number
"""

MODERN, LEGACY = "2026-07-28", "legacy"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, confdir):
    workdir = tmp_path_factory.mktemp("mcp-interim")
    rules = workdir / "rules"
    rules.mkdir()
    (rules / "tracker.yaml").write_text(RULES)
    p = Proxy(workdir, confdir, rules=rules, extra=("--set", f"receipts_mcp_rounds={ROUNDS}")).start()
    yield p
    p.stop()


def issue() -> dict[str, str]:
    return {"title": f"Printer on fire {uuid.uuid4().hex[:8]}", "body": "Third floor"}


def receipts(proxy: Proxy, title: str) -> list[Receipt]:
    store = Store.open(proxy.db, create=False)
    try:
        found = [r for r in store.list(limit=None) if title in json.dumps(r.intent)]
        return sorted(found, key=lambda r: r.submitted_at)
    finally:
        store.close()


def history(proxy: Proxy, operation_id: str) -> list[str]:
    """The receipt's events: a transition as `→state`, anything else by its name."""
    store = Store.open(proxy.db, create=False)
    try:
        return [f"→{e.to_state}" if e.event == "transition" else e.event for e in store.events(operation_id)]
    finally:
        store.close()


def recorded_result(proxy: Proxy, r: Receipt) -> dict:
    """The JSON-RPC result recorded on a receipt (JSON or an event stream), opened as a replay opens it."""
    answer = recorded_answer(proxy.db, r)
    ctype = dict((k.lower(), v) for k, v in answer.headers).get("content-type")
    (message,) = [m for m in messages_of(answer.body, ctype) if "result" in m]
    return message["result"]


def receipt_view(proxy: Proxy, operation_id: str) -> str:
    from proxy_addon.mitm.web import describe

    store = Store.open(proxy.db, create=False)
    try:
        return describe(store, operation_id)
    finally:
        store.close()


def calls_of(server, tool: str) -> list[dict]:
    return server.calls(tool)


def text_of(result: dict) -> str:
    return " ".join(c.get("text", "") for c in result.get("content") or [])


CONFIRM = {"elicit": {"action": "accept", "content": {"confirm": True}}}  # the user confirms every question


def client(proxy: Proxy, server, ops: list[tuple], revision: str, **kw) -> dict:
    return run_client(server.url, ops, revision=revision, proxy=proxy.url, ca=proxy.ca, **{"answers": CONFIRM, **kw})


# --- elicitation: input_required rounds (2026-07-28), a request on the call's stream (2025-11-25) ---------


def test_an_elicitation_tool_is_one_write_across_its_rounds_and_its_final_result_is_replayed(proxy, mcp_server):
    args = issue()
    report = client(proxy, mcp_server, [("call", "create_issue_confirmed", args)] * 2, MODERN)
    first, again = report["results"]
    assert first["ok"] and not first["is_error"], first
    assert again["ok"] and again["structured"] == first["structured"], again  # the final result, not the question
    assert report["elicitations"] == [f"Create the issue {args['title']!r}?"]  # the user was asked once
    assert mcp_server.effects()["created"] == 1
    assert len(calls_of(mcp_server, "create_issue_confirmed")) == 2  # the question's round, and the answer's
    (r,) = receipts(proxy, args["title"])
    assert r.state == "succeeded" and r.mcp_rounds == 1 and r.waiting_for is None
    assert r.external_id == str(first["structured"]["number"])
    assert history(proxy, r.operation_id) == ["→submitted", "input_required", "continued", "→succeeded", "replayed"]
    assert recorded_result(proxy, r)["structuredContent"] == first["structured"]  # what a duplicate is replayed


def test_an_elicitation_on_the_calls_own_event_stream_is_one_write(proxy, mcp_sse_server):
    """2025-11-25: the server's elicitation/create travels on the call's SSE stream, the answer on a POST."""
    mcp_sse_server.reset()
    args = issue()
    report = client(proxy, mcp_sse_server, [("call", "create_issue_confirmed", args)] * 2, LEGACY)
    first, again = report["results"]
    assert first["ok"] and not first["is_error"], first
    assert again["ok"] and again["structured"] == first["structured"], again
    assert len(report["elicitations"]) == 1
    assert mcp_sse_server.effects()["created"] == 1
    (r,) = receipts(proxy, args["title"])
    assert r.state == "succeeded" and r.mcp_rounds == 0
    assert history(proxy, r.operation_id) == ["→submitted", "→succeeded", "replayed"]


def test_a_new_identical_call_while_the_first_waits_for_input_is_refused_at_once(proxy, mcp_json_server):
    """Not made to wait receipts_wait_submitted (30 s, past the client's 5 s): its outcome needs the first's client."""
    mcp_json_server.reset()
    args = issue()
    asked = client(proxy, mcp_json_server, [("call_input", "create_issue_confirmed", args)], MODERN)["results"][0]
    assert asked["result_type"] == "input_required", asked  # the interim answer reached the client untouched
    state, keys = asked["result"]["requestState"], list(asked["result"]["inputRequests"])
    (r,) = receipts(proxy, args["title"])
    assert (r.state, r.waiting_for, r.mcp_rounds) == ("submitted", "input", 1)

    other = client(proxy, mcp_json_server, [("call", "create_issue_confirmed", args)], MODERN, timeout=5.0)
    refused = other["results"][0]
    assert refused["ok"] and refused["is_error"], refused
    assert "waiting for input" in text_of(refused) and r.operation_id in text_of(refused)
    assert other["elicitations"] == []  # nothing reached the server: nobody was asked
    shown = receipt_view(proxy, r.operation_id)  # mitmweb's Receipt view
    assert "WAITING FOR INPUT" in shown and "input required (round)" in shown and "input rounds     1" in shown

    done = client(proxy, mcp_json_server, [("continue", "create_issue_confirmed", args, state, keys)], MODERN)
    finished = done["results"][0]
    assert finished["ok"] and not finished["is_error"] and finished["result_type"] == "complete", finished
    assert mcp_json_server.effects()["created"] == 1
    assert len(calls_of(mcp_json_server, "create_issue_confirmed")) == 2
    (r,) = receipts(proxy, args["title"])
    assert r.state == "succeeded"
    assert history(proxy, r.operation_id) == ["→submitted", "input_required", "blocked", "continued", "→succeeded"]


def test_a_server_that_keeps_asking_for_input_is_stopped_at_receipts_mcp_rounds(proxy, mcp_json_server):
    mcp_json_server.reset()
    title = f"insist {uuid.uuid4().hex[:8]}"
    report = client(proxy, mcp_json_server, [("call", "ask_forever", {"title": title})], MODERN)
    (result,) = report["results"]
    assert result["ok"] and result["is_error"], result  # the proxy's answer to the round past the bound
    assert "receipts_mcp_rounds" in text_of(result) and "NOT SENT" in text_of(result)
    assert len(calls_of(mcp_json_server, "ask_forever")) == ROUNDS + 1  # the call and ROUNDS rounds; not one more
    (r,) = receipts(proxy, title)
    assert (r.state, r.mcp_rounds) == ("outcome_unknown", ROUNDS + 1)
    assert history(proxy, r.operation_id) == [
        "→submitted",
        *["input_required", "continued"] * ROUNDS,
        "input_required",
        "→outcome_unknown",
        "blocked",
    ]


def test_a_call_waiting_for_input_goes_on_after_the_proxy_restarts(tmp_path, confdir, mcp_json_server):
    """Nothing of it is in flight while it waits: recovery leaves it waiting, and its next round completes it."""
    mcp_json_server.reset()
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "tracker.yaml").write_text(RULES)
    p = Proxy(tmp_path, confdir, rules=rules).start()
    try:
        args = issue()
        asked = client(p, mcp_json_server, [("call_input", "create_issue_confirmed", args)], MODERN)["results"][0]
        state, keys = asked["result"]["requestState"], list(asked["result"]["inputRequests"])
        p.stop()
        p.start()
        (r,) = receipts(p, args["title"])
        assert (r.state, r.waiting_for) == ("submitted", "input")
        done = client(p, mcp_json_server, [("continue", "create_issue_confirmed", args, state, keys)], MODERN)
        assert done["results"][0]["ok"] and not done["results"][0]["is_error"], done["results"]
        assert mcp_json_server.effects()["created"] == 1
        (r,) = receipts(p, args["title"])
        assert r.state == "succeeded"
        assert history(p, r.operation_id) == ["→submitted", "input_required", "continued", "→succeeded"]
    finally:
        p.stop()


# --- tasks: 2026-07-28 resultType task (the Tasks extension), 2025-11-25 task-augmented calls ------------

REVISIONS = (MODERN, LEGACY)


@pytest.mark.parametrize("revision", REVISIONS)
def test_a_task_that_completes_makes_its_receipt_succeeded_and_a_retry_is_replayed(proxy, mcp_server, revision):
    args = issue()
    report = client(proxy, mcp_server, [("call_task", "create_issue_later", args)] * 2, revision)
    first, again = report["results"]
    assert first["ok"] and not first["is_error"] and first["structured"]["title"] == args["title"], first
    assert again["ok"] and again["structured"] == first["structured"], again
    assert len(report["tasks"]) == 1  # the retry got the task's result, not another task
    assert mcp_server.effects()["created"] == 1
    assert len(calls_of(mcp_server, "create_issue_later")) == 1
    (r,) = receipts(proxy, args["title"])
    assert (r.state, r.task_revision) == ("succeeded", "2026-07-28" if revision == MODERN else "2025-11-25")
    assert r.external_id == str(first["structured"]["number"])
    assert r.task_hint == report["tasks"][0][:8] + "…"
    assert history(proxy, r.operation_id)[:2] == ["→submitted", "task"]
    assert history(proxy, r.operation_id)[-2:] == ["→succeeded", "replayed"]
    assert recorded_result(proxy, r)["structuredContent"] == first["structured"]


@pytest.mark.parametrize("revision", REVISIONS)
@pytest.mark.parametrize(
    "fault, state, retried",
    [
        ("task_fails", "outcome_unknown", False),
        ("task_cancelled", "outcome_unknown", False),
        ("task_invalid", "rejected", True),
    ],
    ids=["failed-after-acting", "cancelled", "refused-its-parameters"],
)
def test_a_task_that_does_not_complete_settles_its_receipt_by_the_rules(
    proxy, mcp_json_server, revision, fault, state, retried
):
    mcp_json_server.reset()
    args = issue()
    mcp_json_server.queue(fault)
    report = client(proxy, mcp_json_server, [("call_task", "create_issue_later", args)] * 2, revision)
    first, again = report["results"]
    assert not first["ok"], first  # the client learnt the task's failure from the task
    made = 0 if fault == "task_invalid" else 1
    rs = receipts(proxy, args["title"])
    assert rs[0].state == state, history(proxy, rs[0].operation_id)
    if retried:  # a proven refusal: the retry is a new attempt, sent, and its task completes
        assert again["ok"] and not again["is_error"], again
        assert [r.state for r in rs] == ["rejected", "succeeded"] and rs[1].retry_of == rs[0].operation_id
        assert len(calls_of(mcp_json_server, "create_issue_later")) == 2
        assert mcp_json_server.effects()["created"] == made + 1
    else:  # it may have acted: the retry is refused, nothing sent
        assert again["ok"] and again["is_error"] and "whose outcome is unknown" in text_of(again), again
        assert len(rs) == 1 and history(proxy, rs[0].operation_id)[-1] == "blocked"
        assert len(calls_of(mcp_json_server, "create_issue_later")) == 1
        assert mcp_json_server.effects()["created"] == made


@pytest.mark.parametrize("revision", REVISIONS)
def test_a_retry_while_the_task_works_is_refused_with_its_id_and_replayed_once_the_proxy_reads_it_ended(
    proxy, mcp_json_server, revision
):
    mcp_json_server.reset()
    args = issue()
    mcp_json_server.queue("task_hold")
    handle = client(proxy, mcp_json_server, [("task_handle", "create_issue_later", args)], revision)["results"][0]
    task_id = handle["handle"]["taskId"]
    retry = client(proxy, mcp_json_server, [("call_task", "create_issue_later", args)], revision)["results"][0]
    assert retry["ok"] and retry["is_error"] and task_id in text_of(retry), retry
    (r,) = receipts(proxy, args["title"])
    assert (r.state, r.waiting_for, r.task_status) == ("submitted", "task", "working")
    shown = receipt_view(proxy, r.operation_id)  # mitmweb's Receipt view: the task by its first characters
    assert f"WAITING FOR ITS TASK {task_id[:8]}…" in shown and "kept encrypted" in shown and task_id not in shown

    mcp_json_server._control("POST", "/_release")  # the task goes on; nobody polls it
    wait_for(lambda: mcp_json_server.effects()["created"] == 1, timeout=20, what="the held task to make its issue")
    later = client(proxy, mcp_json_server, [("call_task", "create_issue_later", args)], revision)["results"][0]
    assert later["ok"] and not later["is_error"] and later["structured"]["title"] == args["title"], later
    assert len(calls_of(mcp_json_server, "create_issue_later")) == 1
    assert mcp_json_server.effects()["created"] == 1
    (r,) = receipts(proxy, args["title"])
    assert r.state == "succeeded"
    assert history(proxy, r.operation_id) == ["→submitted", "task", "blocked", "→succeeded", "replayed"]
    # the proxy read the task itself, in the task's revision
    own = [q for q in mcp_json_server.effects()["requests"] if "receipt-proxy-task-read" in (q.get("body") or "")]
    assert own and all(
        q["headers"].get("mcp-protocol-version", "2025-11-25") == ("2026-07-28" if revision == MODERN else "2025-11-25")
        for q in own
        if q["jsonrpc_method"] == "tasks/get"
    )


def test_the_task_id_is_never_stored_in_clear(proxy, mcp_json_server):
    mcp_json_server.reset()
    args = issue()
    mcp_json_server.queue("task_hold")
    handle = client(proxy, mcp_json_server, [("task_handle", "create_issue_later", args)], MODERN)["results"][0]
    task_id = handle["handle"]["taskId"]
    mcp_json_server._control("POST", "/_release")
    (r,) = receipts(proxy, args["title"])
    assert (r.waiting_for, r.task_hint) == ("task", task_id[:8] + "…")  # recorded, by its first characters only
    assert task_id.encode() not in Path(proxy.db).read_bytes()
    wal = Path(str(proxy.db) + "-wal")
    assert not wal.exists() or task_id.encode() not in wal.read_bytes()
    assert task_id not in proxy.log()


@pytest.mark.parametrize("revision", REVISIONS)
def test_a_task_its_server_no_longer_knows_leaves_the_outcome_unknown(proxy, mcp_json_server, revision):
    """The proxy's own tasks/get answers -32602 (expired, purged): the task's end can never be read."""
    mcp_json_server.reset()
    args = issue()
    mcp_json_server.queue("task_hold")
    client(proxy, mcp_json_server, [("task_handle", "create_issue_later", args)], revision)
    mcp_json_server.reset()  # the server forgets its tasks (the held one never made its issue)
    retry = client(proxy, mcp_json_server, [("call_task", "create_issue_later", args)], revision)["results"][0]
    assert retry["ok"] and retry["is_error"] and "NOT SENT" in text_of(retry), retry
    assert calls_of(mcp_json_server, "create_issue_later") == [] and mcp_json_server.effects()["created"] == 0
    (r,) = receipts(proxy, args["title"])
    assert r.state == "outcome_unknown" and "no longer knows the task" in (r.error or "")
    assert history(proxy, r.operation_id) == ["→submitted", "task", "→outcome_unknown", "blocked"]


def test_each_round_is_sent_within_a_lifetime_of_its_own(tmp_path, confdir, mcp_json_server):
    """
    A receipt's request may be in flight until `in_flight_until` (receipts_upstream_timeout after it was
    sent), and the proxy never sends past it (send_guard.py). The next round, sent long after the first,
    gets a lifetime of its own: sent, not refused as late.
    """
    import time

    mcp_json_server.reset()
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "tracker.yaml").write_text(RULES)
    p = Proxy(tmp_path, confdir, rules=rules, extra=("--set", "receipts_upstream_timeout=2")).start()
    try:
        args = issue()
        asked = client(p, mcp_json_server, [("call_input", "create_issue_confirmed", args)], MODERN)["results"][0]
        state, keys = asked["result"]["requestState"], list(asked["result"]["inputRequests"])
        (first,) = receipts(p, args["title"])
        time.sleep(3)  # past the first round's in_flight_until
        done = client(p, mcp_json_server, [("continue", "create_issue_confirmed", args, state, keys)], MODERN)
        assert done["results"][0]["ok"] and not done["results"][0]["is_error"], done["results"]
        assert mcp_json_server.effects()["created"] == 1
        (r,) = receipts(p, args["title"])
        assert r.in_flight_until is not None and first.in_flight_until is not None
        assert r.state == "succeeded" and r.in_flight_until > first.in_flight_until
    finally:
        p.stop()


def test_a_next_round_that_never_leaves_leaves_the_outcome_unknown(proxy, tmp_path):
    """Its earlier rounds were sent: that this one never left proves nothing of them (not not_sent)."""
    from tests.e2e.mcp.fixtures import McpServer

    server = McpServer("json", tmp_path).start()
    try:
        args = issue()
        asked = client(proxy, server, [("call_input", "create_issue_confirmed", args)], MODERN)["results"][0]
        state, keys = asked["result"]["requestState"], list(asked["result"]["inputRequests"])
    finally:
        server.stop()  # the next round finds nobody listening: its connection is refused, nothing leaves
    # the SDK client would first discover the (stopped) server: the next round is sent as it sends one
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {
            "name": "create_issue_confirmed",
            "arguments": args,
            "requestState": state,
            "inputResponses": {k: {"action": "accept", "content": {"confirm": True}} for k in keys},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
            },
        },
    }
    headers = {
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "create_issue_confirmed",
        "accept": "application/json, text/event-stream",
    }
    with httpx.Client(proxy=proxy.url, timeout=30, trust_env=False) as http:
        lost = http.post(server.url, json=body, headers=headers)
    said = lost.json()["result"]
    assert said["isError"] and "may or may not have taken effect" in said["content"][0]["text"], said
    (r,) = receipts(proxy, args["title"])
    assert r.state == "outcome_unknown" and "earlier rounds were sent" in (r.error or "")
    assert history(proxy, r.operation_id) == ["→submitted", "input_required", "continued", "→outcome_unknown"]
