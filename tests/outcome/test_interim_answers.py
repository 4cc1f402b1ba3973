"""
MCP answers that are not a write's outcome (input_required, task handles), without a proxy: what the
MCP layer reads of them (outcome/interim_answers.py, outcome/task_ends.py), what the store does with them on each
backend (store/rounds.py: waiting, the next round, the bound on rounds, an abandoned call,
recovery, a task's sealed id), and what the model reads when a duplicate is refused.
The same, through real processes: tests/e2e/mcp/test_interim.py.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from proxy_addon.intent.fingerprint import RequestView, fingerprint
from proxy_addon.outcome.http_answers import duplicate
from proxy_addon.outcome.interim_answers import interim_of
from proxy_addon.outcome.task_ends import TaskReport, result_report, task_outcome
from proxy_addon.outcome.tool_answers import as_tool_answer
from proxy_addon.outcome.tool_outcomes import tool_outcome
from proxy_addon.rules import RuleSet, load_rules
from proxy_addon.states import State
from proxy_addon.store import Attempt, Interim
from proxy_addon.store.sealing import AnswerSeal
from proxy_addon.wire.mcp_calls import ToolCall

KEY = b"k" * 32
RULES = """
api: tracker
hosts: [mcp.example]
operations:
  issues.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
    fingerprint: {body: [params.arguments.title]}
    external_id: number
"""
TASK_ID = "786512e2-9e0d-44bd-8f29-789f320fe840"


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return RuleSet.of([load_rules(RULES, "mcp.yaml")])


def answer(result: dict, *, sse: bool = False, task_call: bool = False):
    body = json.dumps({"jsonrpc": "2.0", "id": 5, "result": result}).encode()
    if sse:
        body = b": ping\n\nevent: message\ndata: " + body + b"\n\n"
    ctype = "text/event-stream" if sse else "application/json"
    op = RuleSet.of([load_rules(RULES, "mcp.yaml")]).operation("tracker", "issues.create")
    assert op is not None
    return tool_outcome(200, "OK", {"content-type": ctype}, body, op, None, 5, task_call=task_call)


# --- what a result is ------------------------------------------------------------------------------


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
def test_input_required_is_no_outcome(sse):
    asked = answer(
        {
            "resultType": "input_required",
            "requestState": "s",
            "inputRequests": {"q": {"method": "elicitation/create", "params": {}}},
        },
        sse=sse,
    )
    assert asked.state is State.SUBMITTED and asked.interim is not None and asked.interim.kind == "input_required"
    assert "elicitation/create" in asked.reason and asked.response is None  # never recorded, never replayed


def test_a_task_handle_is_no_outcome_in_either_revision():
    modern = answer({"resultType": "task", "taskId": TASK_ID, "status": "working", "ttlMs": 1000})
    assert modern.state is State.SUBMITTED and modern.interim is not None
    assert (
        modern.interim.kind,
        modern.interim.task_id,
        modern.interim.task_status,
        modern.interim.task_revision,
        modern.interim.task_ttl,
    ) == ("task", TASK_ID, "working", "2026-07-28", 1.0)
    legacy = answer({"task": {"taskId": TASK_ID, "status": "working", "ttl": None}}, task_call=True)
    assert legacy.interim is not None and (legacy.interim.task_revision, legacy.interim.task_ttl) == (
        "2025-11-25",
        None,
    )
    # not a task-augmented call: a result, as any (its `task` key means nothing to a tool result)
    assert answer({"task": {"taskId": TASK_ID}, "content": []}).state is State.SUCCEEDED


@pytest.mark.parametrize(
    "result",
    [
        {"resultType": "polled"},
        {"resultType": 7},
        {"resultType": "task", "status": "working"},
        {"resultType": "task", "taskId": "x" * 1025, "status": "working"},
        {"resultType": "task", "taskId": ""},
    ],
    ids=["unknown-type", "not-a-string", "task-without-id", "task-id-too-long", "empty-task-id"],
)
def test_a_result_that_cannot_be_read_as_an_outcome_or_followed_is_unknown(result):
    got = answer(result)
    assert got.state is State.OUTCOME_UNKNOWN and got.interim is None


def test_complete_or_no_result_type_is_an_outcome_as_before():
    assert answer({"resultType": "complete", "content": []}).state is State.SUCCEEDED
    assert answer({"content": []}).state is State.SUCCEEDED
    assert interim_of({"result": {"content": []}}) is None


def test_request_state_input_responses_and_task_never_enter_the_fingerprint(rules):
    def fp(**params: object) -> tuple[tuple[str, str], ToolCall]:
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 9,
                "method": "tools/call",
                "params": {"name": "create_issue", "arguments": {"title": "t"}, **params},
            }
        ).encode()
        m = rules.match("mcp.example", 443, "POST", "/mcp", body=body)
        assert m is not None and m.mcp_call is not None
        view = RequestView("POST", "https", "mcp.example", 443, "/mcp", {"content-type": "application/json"}, body)
        got = fingerprint(m, view, KEY)
        from proxy_addon.intent.body_view import NOTES  # notes (the revision a call names) never enter the fingerprint

        intent = {k: v for k, v in got.intent.items() if k not in NOTES}
        return (got.fingerprint, json.dumps(intent, sort_keys=True)), m.mcp_call

    first, call = fp()
    again, next_round = fp(
        requestState="opaque",
        inputResponses={"q": {"action": "accept"}},
        _meta={"io.modelcontextprotocol/protocolVersion": "2026-07-28"},
    )
    augmented, task_call = fp(task={"ttl": 1000})
    assert first == again == augmented
    assert (call.continues, next_round.continues, task_call.task) == (False, True, True)
    misspelled = rules.match(
        "mcp.example",
        443,
        "POST",
        "/mcp",
        body=json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 9,
                "method": "tools/call",
                "params": {"name": "create_issue", "arguments": {}, "RequestState": "x"},
            }
        ).encode(),
    )
    assert misspelled.refused_as == "bad_json"  # a server that folds case would read it as requestState


# --- a task's end -------------------------------------------------------------------------------------


def ended(rules, report: TaskReport, revision: str = "2026-07-28"):
    return task_outcome(report, rules.operation("tracker", "issues.create"), revision, "786512e2…")


@pytest.mark.parametrize(
    "report, revision, state",
    [
        (
            TaskReport("completed", {"result": {"content": [], "structuredContent": {"number": 4}}}),
            "2026-07-28",
            State.SUCCEEDED,
        ),
        (TaskReport("completed", {"result": {"content": [], "isError": True}}), "2026-07-28", State.REJECTED),
        (TaskReport("failed", {"error": {"code": -32602, "message": "bad title"}}), "2026-07-28", State.REJECTED),
        (
            TaskReport("failed", {"error": {"code": -32603, "message": "after commit"}}),
            "2026-07-28",
            State.OUTCOME_UNKNOWN,
        ),
        (TaskReport("cancelled"), "2026-07-28", State.OUTCOME_UNKNOWN),
        (TaskReport(None, gone=True), "2026-07-28", State.OUTCOME_UNKNOWN),
        (TaskReport(None, expired="HTTP 502"), "2025-11-25", State.OUTCOME_UNKNOWN),
        (TaskReport("completed"), "2026-07-28", State.OUTCOME_UNKNOWN),  # its result must be inline
        (TaskReport("completed"), "2025-11-25", None),  # tasks/result tells
        (TaskReport("failed"), "2025-11-25", None),
        (TaskReport("working"), "2026-07-28", None),
        (TaskReport("input_required"), "2025-11-25", None),
    ],
    ids=[
        "completed",
        "completed-isError",
        "failed-invalid-params",
        "failed-internal",
        "cancelled",
        "gone",
        "expired",
        "completed-without-result",
        "legacy-completed",
        "legacy-failed",
        "working",
        "input-required",
    ],
)
def test_a_tasks_end_is_judged_as_the_calls_answer_would_be(rules, report, revision, state):
    got = ended(rules, report, revision)
    assert (got.state if got is not None else None) is state
    if got is not None:
        assert got.reason.startswith("task 786512e2… ") and got.interim is None


def test_a_completed_tasks_result_is_recorded_to_replay(rules):
    got = ended(rules, TaskReport("completed", {"result": {"content": [], "structuredContent": {"number": 4}}}))
    assert got.external_id == "4" and got.response is not None
    recorded = json.loads(got.response.body)
    assert recorded["result"]["resultType"] == "complete"  # what a 2026-07-28 client requires
    assert recorded["result"]["structuredContent"] == {"number": 4}


def test_a_tasks_result_error_counts_only_for_a_task_seen_failed():
    error = {"jsonrpc": "2.0", "id": 3, "error": {"code": -32602, "message": "Task not found"}}
    assert result_report(error, "working") is None  # may be "no such task"
    assert result_report(error, "failed") == TaskReport("failed", {"error": error["error"]}, said="tasks/result")
    ok = {"jsonrpc": "2.0", "id": 3, "result": {"content": []}}
    report = result_report(ok, None)
    assert report is not None and report.message == {"result": {"content": []}}


# --- the store, on each backend ---------------------------------------------------------------------


def attempt(fp: str = "fp-1", **kw) -> Attempt:
    fields: dict[str, Any] = dict(
        api="tracker",
        operation="issues.create",
        method="POST",
        target="https://mcp.example/mcp",
        intent_fingerprint=fp,
        intent={"tool": "create_issue"},
        principal="agent-1",
        flow_id="flow-1",
        instance="inst-1",
        upstream_timeout=300.0,
        mcp_rounds=2,
    )
    fields.update(kw)
    return Attempt(**fields)


ASKED = Interim("input_required", "the server asked for input")
TASK = Interim(
    "task", "the server runs it as a task", task_id=TASK_ID, task_status="working", task_revision="2026-07-28"
)


@pytest.fixture
def store(backend_store):
    backend_store.answer_seal = AnswerSeal(KEY)
    return backend_store


def events(store, operation_id: str) -> list[str]:
    return [e.event if e.event != "transition" else f"→{e.to_state}" for e in store.events(operation_id)]


def test_a_call_waiting_for_input_goes_on_under_its_receipt(store, clock):
    first = store.begin_attempt(attempt()).receipt
    waiting = store.record_interim(first.operation_id, ASKED, input_wait=600)
    assert (waiting.state, waiting.waiting_for, waiting.mcp_rounds) == (State.SUBMITTED, "input", 1)
    assert waiting.completed_at is not None  # the round is over: nothing in flight

    dup = store.begin_attempt(attempt(flow_id="flow-2"))
    assert dup.kind == "blocked" and dup.receipt.waiting_for == "input"

    clock.advance(10)
    went_on = store.begin_attempt(attempt(flow_id="flow-3", continues=True, instance="inst-2", upstream_timeout=60.0))
    assert went_on.kind == "forward" and went_on.receipt.operation_id == first.operation_id
    r = went_on.receipt
    assert (r.waiting_for, r.completed_at, r.instance) == (None, None, "inst-2")
    assert dt.datetime.fromisoformat(r.in_flight_until) == clock.now + dt.timedelta(seconds=60)  # a new lifetime

    again = store.begin_attempt(attempt(flow_id="flow-4", continues=True))  # the round is in flight: a duplicate
    assert again.kind == "blocked" and again.receipt.waiting_for is None
    done = store.record_outcome(first.operation_id, State.SUCCEEDED, reason="HTTP 200")
    assert (done.state, done.waiting_for) == (State.SUCCEEDED, None)
    assert events(store, first.operation_id) == [
        "→submitted",
        "input_required",
        "blocked",
        "continued",
        "blocked",
        "→succeeded",
    ]
    assert store.begin_attempt(attempt(continues=True)).kind in ("replay", "blocked_succeeded")  # never sent again


def test_a_server_that_asks_too_often_gets_no_more_rounds(store):
    r = store.begin_attempt(attempt()).receipt
    for _ in range(3):  # mcp_rounds=2: the third question is one too many
        store.record_interim(r.operation_id, ASKED, input_wait=600)
        d = store.begin_attempt(attempt(continues=True))
        if d.kind == "forward":
            continue
    assert d.kind == "blocked" and d.note is not None and "receipts_mcp_rounds (2)" in d.note
    assert (d.receipt.state, d.receipt.mcp_rounds) == (State.OUTCOME_UNKNOWN, 3)
    assert events(store, r.operation_id)[-2:] == ["→outcome_unknown", "blocked"]


def test_a_call_whose_client_never_goes_on_is_unknown_past_its_wait(store, clock):
    r = store.begin_attempt(attempt()).receipt
    store.record_interim(r.operation_id, ASKED, input_wait=600)
    clock.advance(599)
    assert store.begin_attempt(attempt()).receipt.state is State.SUBMITTED
    clock.advance(2)
    late = store.begin_attempt(attempt(continues=True))
    assert late.kind == "blocked" and late.receipt.state is State.OUTCOME_UNKNOWN
    assert "receipts_mcp_input_wait" in (late.receipt.error or "")


def test_recovery_leaves_waiting_receipts_and_recovers_a_round_in_flight(store):
    asked = store.begin_attempt(attempt("fp-a")).receipt
    store.record_interim(asked.operation_id, ASKED, input_wait=600)
    tasked = store.begin_attempt(attempt("fp-t")).receipt
    store.record_interim(tasked.operation_id, TASK)
    going = store.begin_attempt(attempt("fp-g")).receipt
    store.record_interim(going.operation_id, ASKED, input_wait=600)
    store.begin_attempt(attempt("fp-g", continues=True))  # its next round, in flight when the proxy stopped
    recovered = store.recover_in_flight(is_alive=lambda instance: False)
    assert recovered == [going.operation_id]
    assert store.get(asked.operation_id).waiting_for == "input"
    assert store.get(tasked.operation_id).waiting_for == "task"
    gone = store.get(going.operation_id)
    assert gone.state is State.OUTCOME_UNKNOWN and gone.completed_at is None  # a read waits out its lifetime


def test_a_tasks_id_is_sealed_and_found_by_its_reference(store):
    r = store.begin_attempt(attempt()).receipt
    waiting = store.record_interim(r.operation_id, TASK)
    assert (waiting.waiting_for, waiting.task_hint, waiting.task_status) == ("task", "786512e2…", "working")
    row = store._rows("SELECT * FROM receipts WHERE operation_id = ?", (r.operation_id,))[0]
    assert TASK_ID not in json.dumps({k: v for k, v in row.items() if not isinstance(v, (bytes, memoryview))})
    assert TASK_ID.encode() not in bytes(row["task_sealed"])
    assert store.waiting_task("tracker", TASK_ID).operation_id == r.operation_id
    assert store.waiting_task("another-api", TASK_ID) is None
    dup = store.begin_attempt(attempt(flow_id="flow-2"))
    assert dup.kind == "blocked" and dup.task_id == TASK_ID  # for the write's own caller
    unsure = store.begin_attempt(attempt(flow_id="flow-3", unreplayable=("fp-1",)))
    assert unsure.kind == "blocked" and unsure.task_id is None  # maybe another caller: never its task's id
    assert store.begin_attempt(attempt(continues=True)).kind == "blocked"  # a task is not a round of input
    assert store.note_task(r.operation_id, "input_required", "task 786512e2… is input_required")
    assert not store.note_task(r.operation_id, "input_required", "again")  # one event per change
    assert events(store, r.operation_id) == ["→submitted", "task", "blocked", "blocked", "blocked", "task"]


def test_the_next_round_is_never_decided_without_waiting_for_the_disk(tmp_path, clock):
    """The event loop's connection (no wait, not durable) leaves the next round to a durable transaction."""
    from proxy_addon.store import Store

    s = Store.open(tmp_path / "receipts.db", clock=clock)
    s.answer_seal = AnswerSeal(KEY)
    try:
        r = s.begin_attempt(attempt()).receipt
        s.record_interim(r.operation_id, ASKED, input_wait=600)
        assert s.answer_duplicate(attempt(continues=True)) == "new"
        assert s.get(r.operation_id).waiting_for == "input"  # nothing written
        assert s.begin_attempt(attempt(continues=True)).kind == "forward"
    finally:
        s.close()


# --- what the model reads --------------------------------------------------------------------------


def text(answer) -> str:
    return json.loads(answer.body)["result"]["content"][0]["text"]


def test_a_refused_duplicate_says_what_the_first_call_waits_for(store):
    call = ToolCall(8, "create_issue", {"title": "t"}, modern=True)
    r = store.begin_attempt(attempt()).receipt
    waiting = store.record_interim(r.operation_id, ASKED, input_wait=600)
    said = text(as_tool_answer(duplicate(waiting, "blocked"), call, "application/json"))
    assert "waiting for input" in said and r.operation_id in said and "NOT SENT" in said

    other = store.begin_attempt(attempt("fp-2")).receipt
    tasked = store.record_interim(other.operation_id, TASK)
    said = text(as_tool_answer(duplicate(tasked, "blocked", task_id=TASK_ID), call, "application/json"))
    assert f"task {TASK_ID}" in said and "working" in said and "tasks/get" in said
    assert TASK_ID not in text(as_tool_answer(duplicate(tasked, "blocked"), call, "application/json"))

    for _ in range(2):
        store.begin_attempt(attempt(continues=True))
        store.record_interim(r.operation_id, ASKED, input_wait=600)
    refused = store.begin_attempt(attempt(continues=True))
    note = refused.note
    assert note is not None and "more than receipts_mcp_rounds (2) allows" in note
    said = text(as_tool_answer(duplicate(refused.receipt, "blocked", note=note), call, "application/json"))
    assert note in said and "NOT SENT" in said


def test_rules_explain_says_how_multi_round_trip_calls_and_tasks_are_handled(rules):
    from proxy_addon.explain import explain, render

    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "create_issue", "arguments": {"title": "t"}},
        }
    ).encode()
    shown = render(explain(rules, "POST", "https://mcp.example/mcp", body, {"content-type": "application/json"}, KEY))
    assert "input_required" in shown and "receipts_mcp_rounds" in shown and "requestState" in shown
    assert "task handle" in shown and "tasks/get" in shown and "cancelled" in shown
    assert "refused, with the task's id" in shown and "refused at once" in shown
