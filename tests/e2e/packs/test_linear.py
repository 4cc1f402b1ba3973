"""
rules/linear.yaml against a fake Linear GraphQL endpoint.

Every Linear call is a POST to /graphql. The fake parses each body with graphql-core (as
Linear would), keeps the issues it created, and follows a per-title script for the
issueCreate mutation: "ok", "commit_drop" (creates, then closes the connection),
"drop" (closes without creating), "commit_internal" (creates, then answers a GraphQL
"internal error"), "invalid", "ratelimited", "success_false", "http500". The reconcile
read is the pack's `issues(filter: {id: {eq: $id}})` query.

Each test uses its own title, so counts and fingerprints never mix across tests.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest
from graphql import parse
from graphql.language import FieldNode, OperationDefinitionNode, OperationType
from graphql.utilities import value_from_ast_untyped

from tests.e2e.packs.harness import PackRun, Seen, State, pack_run

GQL = "/graphql"
KEY = "lin_api_FAKEtestkeyNotReal0000000000000000000000"
TEAM = "9cfb482a-81e3-4154-b5b9-2c805e70a02d"

# Linear's SDK: `mutation createIssue($input: IssueCreateInput!) { issueCreate(input: $input) { ... } }`
SDK_MUTATION = """mutation createIssue($input: IssueCreateInput!) {
  issueCreate(input: $input) { success lastSyncId issue { id identifier title } }
}"""


class FakeLinear:
    """The answers of api.linear.app/graphql, with a script of outcomes per issue title."""

    def __init__(self) -> None:
        self.issues: dict[str, dict[str, Any]] = {}
        self.plans: dict[str, list[str]] = {}
        self.lookup_fails: set[str] = set()  # issue ids whose lookup answers a GraphQL error
        self.lagging: set[str] = set()  # issue ids the lookup does not list yet (a read behind the write)
        self.lock = threading.Lock()

    def plan(self, title: str, *steps: str) -> None:
        self.plans[title] = list(steps)

    def __call__(self, seen: Seen):
        doc = seen.json()
        document = parse(doc["query"])
        ops = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
        op = next(o for o in ops if not doc.get("operationName") or (o.name and o.name.value == doc["operationName"]))
        field = next(s for s in op.selection_set.selections if isinstance(s, FieldNode))
        args = {
            a.name.value: value_from_ast_untyped(a.value, doc.get("variables") or {}) for a in field.arguments or ()
        }
        if op.operation is OperationType.QUERY:
            if field.name.value == "issues" and "filter" in args:
                wanted = args["filter"]["id"]["eq"]
                if wanted in self.lookup_fails:
                    return (
                        200,
                        {},
                        {
                            "errors": [{"message": "Internal server error", "extensions": {"type": "internal error"}}],
                            "data": None,
                        },
                    )
                with self.lock:
                    nodes = [
                        {"id": i["id"], "identifier": i["identifier"]}
                        for i in self.issues.values()
                        if i["id"] == wanted and wanted not in self.lagging
                    ]
                return 200, {}, {"data": {"issues": {"nodes": nodes}}}
            return 200, {}, {"data": {"viewer": {"id": "user-1", "name": "Test User"}}}
        if field.name.value != "issueCreate":
            return 200, {}, {"data": {field.name.value: {"success": True, "lastSyncId": 1}}}
        inp = args["input"]
        with self.lock:
            steps = self.plans.get(inp["title"]) or ["ok"]
            step = steps.pop(0) if len(steps) > 1 else steps[0]
        if step == "invalid":
            return (
                400,
                {},
                {
                    "errors": [
                        {
                            "message": "Argument Validation Error",
                            "extensions": {
                                "type": "invalid input",
                                "userError": True,
                                "userPresentableMessage": "teamId must be a UUID.",
                            },
                        }
                    ]
                },
            )
        if step == "ratelimited":
            return (
                400,
                {},
                {
                    "errors": [
                        {
                            "message": "Rate limit exceeded",
                            "extensions": {
                                "code": "RATELIMITED",
                                "type": "ratelimited",
                                "userPresentableMessage": "Rate limit exceeded.",
                            },
                        }
                    ]
                },
            )
        if step == "success_false":
            return 200, {}, {"data": {"issueCreate": {"success": False, "lastSyncId": 0, "issue": None}}}
        if step == "http500":
            return 500, {}, "upstream connect error"
        if step == "drop":
            return 0, {}, None
        issue = self._create(inp)
        if step == "commit_drop":
            return 0, {}, None
        if step.startswith("commit_type:"):  # the issue was made, then the answer is an error of this type
            return (
                200,
                {},
                {
                    "errors": [
                        {
                            "message": "Something went wrong",
                            "extensions": {
                                "type": step.partition(":")[2],
                                "userPresentableMessage": "Something went wrong.",
                            },
                        }
                    ],
                    "data": None,
                },
            )
        if step == "commit_internal":
            return (
                200,
                {},
                {
                    "errors": [
                        {
                            "message": "Internal server error",
                            "extensions": {
                                "type": "internal error",
                                "userPresentableMessage": "An unexpected error occurred.",
                            },
                        }
                    ],
                    "data": None,
                },
            )
        return (
            200,
            {},
            {
                "data": {
                    "issueCreate": {
                        "success": True,
                        "lastSyncId": 42,
                        "issue": {"id": issue["id"], "identifier": issue["identifier"], "title": issue["title"]},
                    }
                }
            },
        )

    def _create(self, inp: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            issue_id = inp.get("id") or str(uuid.uuid4())
            issue = {"id": issue_id, "identifier": f"ENG-{len(self.issues) + 1}", "title": inp["title"]}
            self.issues[issue_id] = issue
            return issue


@pytest.fixture(scope="module")
def linear(tmp_path_factory, confdir):
    for run in pack_run("linear.yaml", tmp_path_factory.mktemp("linear"), confdir, headers={"Authorization": KEY}):
        run.fake = FakeLinear()
        run.api.on("POST", GQL, run.fake)
        yield run


def fresh() -> str:
    return f"Checkout button broken {uuid.uuid4().hex[:10]}"


def sdk_body(title: str, description: str = "Steps to reproduce: click it.") -> dict:
    return {
        "operationName": "createIssue",
        "query": SDK_MUTATION,
        "variables": {"input": {"title": title, "teamId": TEAM, "description": description}},
    }


def inline_body(title: str, description: str = "Steps to reproduce: click it.") -> dict:
    return {
        "query": f"mutation {{ issueCreate(input: {{title: {json.dumps(title)}, teamId: {json.dumps(TEAM)}, "
        f"description: {json.dumps(description)}}}) {{ success issue {{ id identifier }} }} }}"
    }


def mutations(run: PackRun, title: str) -> list[Seen]:
    """The issueCreate requests the fake received for this title."""
    return [
        s for s in run.api.requests("POST") if s.path == GQL and b"issueCreate" in s.body and title.encode() in s.body
    ]


def lookups(run: PackRun, issue_id: str) -> list[Seen]:
    return [
        s
        for s in run.api.requests("POST")
        if s.path == GQL and b"ReceiptIssueById" in s.body and s.json()["variables"]["id"] == issue_id
    ]


def sent_input(seen: Seen) -> dict:
    return seen.json()["variables"]["input"]


to_states = PackRun.states


receipt_count = PackRun.receipt_count


# --- matching and fingerprints -----------------------------------------------------------------


def test_sdk_mutation_named_createIssue_gets_a_receipt_and_a_proxy_chosen_uuid4_id(linear):
    title = fresh()
    r = linear.send("POST", GQL, json=sdk_body(title))
    assert r.status_code == 200 and r.json()["data"]["issueCreate"]["success"] is True
    assert r.headers["x-receipt-state"] == "succeeded"
    [write] = mutations(linear, title)
    issue_id = sent_input(write)["id"]
    assert uuid.UUID(issue_id).version == 4  # the proxy wrote a UUID v4 into input.id
    assert sent_input(write)["title"] == title  # and left the agent's fields alone
    receipt = linear.receipt(r)
    assert receipt.state is State.SUCCEEDED
    assert receipt.idempotency_key == issue_id
    assert receipt.external_id == issue_id == r.json()["data"]["issueCreate"]["issue"]["id"]
    assert receipt.intent["body"] == {
        "input.title": title,
        "input.teamId": TEAM,
        "input.description": "Steps to reproduce: click it.",
    }


def test_an_agents_own_issue_id_is_kept_and_becomes_the_key(linear):
    title, own = fresh(), str(uuid.uuid4())
    body = sdk_body(title)
    body["variables"]["input"]["id"] = own
    r = linear.send("POST", GQL, json=body)
    assert r.headers["x-receipt-state"] == "succeeded"
    [write] = mutations(linear, title)
    assert sent_input(write)["id"] == own
    assert linear.receipt(r).idempotency_key == own


def test_inline_arguments_are_recognised_and_fingerprinted_like_variables(linear):
    title = fresh()
    first = linear.send("POST", GQL, json=inline_body(title))
    assert first.status_code == 200 and first.headers["x-receipt-state"] == "succeeded"
    inline_receipt = linear.receipt(first)
    assert inline_receipt.operation == "issues.create"
    assert inline_receipt.intent["body"]["input.title"] == title
    # The same intent sent the SDK's way is the same fingerprint: a duplicate, replayed.
    again = linear.send("POST", GQL, json=sdk_body(title))
    assert again.headers["x-receipt-state"] == "succeeded"
    assert again.headers["x-receipt-id"] == first.headers["x-receipt-id"]
    assert again.headers.get("x-receipt-replayed") == "true"
    assert len(mutations(linear, title)) == 1


def test_a_different_description_is_a_different_intent(linear):
    title = fresh()
    one = linear.send("POST", GQL, json=sdk_body(title, "first"))
    two = linear.send("POST", GQL, json=sdk_body(title, "second"))
    assert one.headers["x-receipt-id"] != two.headers["x-receipt-id"]
    assert linear.receipt(one).intent_fingerprint != linear.receipt(two).intent_fingerprint
    assert len(mutations(linear, title)) == 2


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"query": "query { viewer { id name } }"}, id="query"),
        pytest.param({"operationName": "me", "query": "query me { viewer { id } }"}, id="named-query"),
        pytest.param(
            {"operationName": "createIssue", "query": "query createIssue { viewer { id } }"},
            id="query-named-like-the-sdk-mutation",
        ),
        pytest.param(
            {"query": 'mutation { issueUpdate(id: "ENG-1", input: {title: "x"}) { success } }'}, id="other-mutation"
        ),
    ],
)
def test_reads_and_other_mutations_pass_through_without_a_receipt(linear, body):
    before = receipt_count(linear)
    seen_before = len(linear.api.requests("POST"))
    r = linear.send("POST", GQL, json=body)
    assert r.status_code == 200
    assert "x-receipt-id" not in r.headers and "x-receipt-state" not in r.headers
    assert len(linear.api.requests("POST")) == seen_before + 1  # forwarded, once
    assert linear.api.requests("POST")[-1].json() == body  # untouched
    assert receipt_count(linear) == before


# --- outcomes of the write ---------------------------------------------------------------------


@pytest.mark.parametrize("step", ["invalid", "ratelimited", "success_false"])
def test_graphql_refusals_are_rejected_and_a_retry_is_sent(linear, step):
    title = fresh()
    linear.fake.plan(title, step, "ok")
    r = linear.send("POST", GQL, json=sdk_body(title))
    assert r.headers["x-receipt-state"] == "rejected"
    assert linear.receipt(r).state is State.REJECTED
    assert not linear.fake.issues.get(sent_input(mutations(linear, title)[0])["id"])
    retry = linear.send("POST", GQL, json=sdk_body(title))  # a rejection blocks nothing
    assert retry.headers["x-receipt-state"] == "succeeded"
    assert len(mutations(linear, title)) == 2


@pytest.mark.parametrize("step", ["commit_internal", "http500", "commit_drop"])
def test_internal_errors_5xx_and_lost_connections_are_unknown(linear, step):
    title = fresh()
    linear.fake.plan(title, step)
    r = linear.send("POST", GQL, json=sdk_body(title))
    assert r.headers["x-receipt-state"] == "outcome_unknown"
    assert linear.receipt(r).state is State.OUTCOME_UNKNOWN
    assert len(mutations(linear, title)) == 1


@pytest.mark.parametrize("error_type", ["network error", "unknown", "other"])
def test_errors_that_do_not_say_refused_are_unknown_and_never_make_a_second_issue(linear, error_type):
    title = fresh()
    linear.fake.plan(title, f"commit_type:{error_type}", "ok")  # Linear made the issue, then answered an error
    r = linear.send("POST", GQL, json=sdk_body(title))
    assert r.headers["x-receipt-state"] == "outcome_unknown"
    assert linear.receipt(r).state is State.OUTCOME_UNKNOWN  # not rejected: no new id for the retry
    issue_id = sent_input(mutations(linear, title)[0])["id"]
    assert issue_id in linear.fake.issues
    retry = linear.send("POST", GQL, json=sdk_body(title))  # the read by id finds it
    assert retry.headers["x-receipt-state"] == "succeeded"
    assert retry.headers["x-receipt-id"] == r.headers["x-receipt-id"]
    assert len(mutations(linear, title)) == 1  # never a second issueCreate
    assert [i for i in linear.fake.issues.values() if i["title"] == title] == [linear.fake.issues[issue_id]]


# --- reconcile: a read by the proxy-chosen id ---------------------------------------------------


def test_unknown_then_the_read_finds_the_issue_by_its_id(linear):
    title = fresh()
    linear.fake.plan(title, "commit_internal", "ok")
    first = linear.send("POST", GQL, json=sdk_body(title))
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    issue_id = sent_input(mutations(linear, title)[0])["id"]
    assert issue_id in linear.fake.issues  # it did happen

    retry = linear.send("POST", GQL, json=sdk_body(title))
    assert retry.headers["x-receipt-state"] == "succeeded"
    assert retry.headers["x-receipt-id"] == first.headers["x-receipt-id"]
    assert len(lookups(linear, issue_id)) == 1  # one read, a POST query
    assert len(mutations(linear, title)) == 1  # never a second write
    receipt = linear.receipt(first)
    assert receipt.state is State.SUCCEEDED and receipt.external_id == issue_id
    assert to_states(linear, receipt.operation_id) == [
        State.SUBMITTED,
        State.OUTCOME_UNKNOWN,
        State.RECONCILING,
        State.SUCCEEDED,
    ]


def test_unknown_then_absence_is_proven_and_the_retry_reuses_the_same_id(linear):
    title = fresh()
    linear.fake.plan(title, "drop", "ok")
    first = linear.send("POST", GQL, json=sdk_body(title))
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    issue_id = sent_input(mutations(linear, title)[0])["id"]
    assert issue_id not in linear.fake.issues

    retry = linear.send("POST", GQL, json=sdk_body(title))
    assert retry.status_code == 200 and retry.headers["x-receipt-state"] == "succeeded"
    assert len(lookups(linear, issue_id)) == 1
    writes = mutations(linear, title)
    assert len(writes) == 2
    assert sent_input(writes[1])["id"] == issue_id  # same id: Linear would refuse a twin
    assert linear.receipt(first).state is State.SAFE_TO_RETRY
    assert linear.receipt(retry).retry_of == first.headers["x-receipt-id"]
    assert linear.receipt(retry).external_id == issue_id


def test_a_retry_with_another_id_of_the_agents_is_sent_with_the_first_attempts_id(linear):
    """
    The agent chose its own input.id, and chose a new one for its retry. The first attempt's
    answer was lost after Linear made the issue, and the read missed it (a read behind the
    write: a wrong "absent"). The retry must carry the first attempt's id, which Linear would
    refuse as a twin; with the agent's new id, Linear would make a second issue.
    """
    title, own, other = fresh(), str(uuid.uuid4()), str(uuid.uuid4())
    linear.fake.plan(title, "commit_drop", "ok")
    linear.fake.lagging.add(own)
    body = sdk_body(title)
    body["variables"]["input"]["id"] = own
    first = linear.send("POST", GQL, json=body)
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    assert linear.receipt(first).idempotency_key == own and own in linear.fake.issues

    body["variables"]["input"]["id"] = other
    retry = linear.send("POST", GQL, json=body)
    assert retry.status_code == 200 and retry.headers["x-receipt-state"] == "succeeded"
    assert linear.receipt(first).state is State.SAFE_TO_RETRY  # the read proved a wrong "absent"
    assert [sent_input(s)["id"] for s in mutations(linear, title)] == [own, own]
    assert [i["id"] for i in linear.fake.issues.values() if i["title"] == title] == [own]  # one issue
    assert linear.receipt(retry).idempotency_key == own == retry.headers["x-receipt-idempotency-key"]
    assert sent_input(mutations(linear, title)[1])["title"] == title  # the rest of the input as the agent sent it


def test_a_failed_read_proves_nothing_and_the_retry_is_blocked(linear):
    title = fresh()
    linear.fake.plan(title, "drop")
    first = linear.send("POST", GQL, json=sdk_body(title))
    issue_id = sent_input(mutations(linear, title)[0])["id"]
    linear.fake.lookup_fails.add(issue_id)  # the read answers a GraphQL error

    retry = linear.send("POST", GQL, json=sdk_body(title))
    assert retry.status_code == 409
    assert retry.headers["x-receipt-state"] == "outcome_unknown"  # nothing proven: still unknown, read later
    assert int(retry.headers["retry-after"]) >= 1
    assert len(lookups(linear, issue_id)) == 1
    assert len(mutations(linear, title)) == 1
    assert linear.receipt(first).state is State.OUTCOME_UNKNOWN


def test_an_inline_mutation_gets_the_proxy_chosen_id_written_into_its_document(linear):
    """
    An inline `issueCreate(input: {...})` has no variable to carry input.id: the proxy writes
    its id into the document's literal, so the read by id is exact for it too.
    """
    title = fresh()
    linear.fake.plan(title, "commit_drop", "ok")
    first = linear.send("POST", GQL, json=inline_body(title))
    assert first.headers["x-receipt-state"] == "outcome_unknown"
    key = linear.receipt(first).idempotency_key
    assert key is not None and str(uuid.UUID(key, version=4)) == key
    [sent] = mutations(linear, title)
    assert "variables" not in sent.json() or not sent.json()["variables"]  # still inline...
    assert f'id: "{key}"' in sent.json()["query"]  # ...with the proxy's id in it
    assert key in linear.fake.issues  # the issue Linear made has that id

    retry = linear.send("POST", GQL, json=inline_body(title))
    assert (retry.status_code, retry.headers["x-receipt-state"]) == (409, "succeeded")
    assert len(lookups(linear, key)) == 1 and len(mutations(linear, title)) == 1
    assert linear.receipt(first).external_id == key
