"""
The rules features real APIs need, at the level of pure functions: classification by body
and headers, GraphQL matching and arguments, multipart fingerprints, ids from headers and
composite fields, proxy-chosen body ids, POST reads, settle delays and absent_when.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import httpx
import pytest

from proxy_addon.errors import ReconcileError, RulesError
from proxy_addon.intent import identity
from proxy_addon.intent.body_view import multipart_parts
from proxy_addon.intent.fingerprint import RequestView, fingerprint
from proxy_addon.outcome.classify import classify_response, dig_all, response_external_id
from proxy_addon.reconcile.http_reads import ReadRequest, plan_read
from proxy_addon.reconcile.http_reads import check_read as _check
from proxy_addon.reconcile.judge import judge
from proxy_addon.rules import ALREADY_EXISTS, Match, RuleSet, load_rules
from proxy_addon.states import State
from proxy_addon.store import Receipt
from proxy_addon.wire import gql

KEY = b"k" * 32


def rules(text: str):
    return load_rules(text, "api.yaml")


def op_of(text: str):
    return rules(text).operations[0]


HEAD = "api: demo\nhosts: [api.demo.test]\n"

# --- classify by body and headers ------------------------------------------------------------

SLACKISH = (
    HEAD
    + """\
operations:
  post:
    match: {method: POST, path: /api/chat.postMessage}
    fingerprint: {body: [channel, text]}
    external_id: [channel, ts]
    classify:
      - status: 200
        body: {ok: false, error: [internal_error, fatal_error]}
        state: outcome_unknown
        reason: may have partly succeeded
      - {status: 200, body: {ok: false}, state: rejected}
      - {status: 422, body: {"errors.*.code": already_exists}, state: already_exists}
      - {status: 422, body: {"errors.*.message": {contains: "A pull request already exists"}}, state: already_exists}
      - {status: 409, body: {name: {matches: "^concurrent_"}}, state: already_exists}
      - {status: 2xx, body: {errors: {present: true}}, state: rejected}
      - {headers: {x-outcome: unknown}, state: outcome_unknown}
    reconcile:
      read: {url: /api/conversations.history}
      items: messages
      find: {text: "{intent.text}"}
"""
)


@pytest.mark.parametrize(
    "status, headers, body, expected",
    [
        (200, {}, {"ok": True, "channel": "C1", "ts": "1.2"}, State.SUCCEEDED),
        (200, {}, {"ok": False, "error": "internal_error"}, State.OUTCOME_UNKNOWN),
        (200, {}, {"ok": False, "error": "fatal_error"}, State.OUTCOME_UNKNOWN),
        (200, {}, {"ok": False, "error": "channel_not_found"}, State.REJECTED),
        (200, {}, {"ok": 0, "error": "x"}, State.SUCCEEDED),  # JSON types: 0 is not false
        (422, {}, {"errors": [{"code": "invalid"}, {"code": "already_exists"}]}, ALREADY_EXISTS),
        (
            422,
            {},
            {"errors": [{"code": "custom", "message": "A pull request already exists for o:b."}]},
            ALREADY_EXISTS,
        ),
        (422, {}, {"errors": [{"code": "missing_field"}]}, State.REJECTED),
        (409, {}, {"name": "concurrent_idempotent_requests"}, ALREADY_EXISTS),
        (409, {}, {"name": "invalid_idempotent_request"}, ALREADY_EXISTS),  # no rule fits: the 409 default, "maybe"
        (201, {}, {"data": None, "errors": [{"message": "bad"}]}, State.REJECTED),
        (201, {}, {"data": {}, "errors": []}, State.SUCCEEDED),  # an empty list is present: see next
        (500, {"x-outcome": "unknown"}, {}, State.OUTCOME_UNKNOWN),
        (200, {}, b"not json", State.SUCCEEDED),  # a body rule never fits a body that is not JSON
        (503, {}, {"ok": False}, State.OUTCOME_UNKNOWN),  # status does not fit the rules: the defaults
    ],
)
def test_classify_rules_by_status_body_and_headers(status, headers, body, expected):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    verdict, _ = classify_response(status, headers, raw, op_of(SLACKISH))
    if body == {"data": {}, "errors": []}:
        expected = State.REJECTED  # present: [] is a value at the path, so {present: true} fits
    assert verdict == expected


def test_a_classify_rule_reason_comes_back():
    raw = json.dumps({"ok": False, "error": "internal_error"}).encode()
    assert classify_response(200, {}, raw, op_of(SLACKISH)) == (State.OUTCOME_UNKNOWN, "may have partly succeeded")


def test_dig_all_follows_every_item_of_a_list():
    doc = {"errors": [{"code": "a"}, {"code": "b"}, {"nope": 1}]}
    assert dig_all(doc, "errors.*.code") == ["a", "b"]
    assert dig_all(doc, "errors.0.code") == ["a"]
    assert dig_all(doc, "missing.*.code") == [None]


def test_composite_and_header_ids():
    op = op_of(SLACKISH)
    assert response_external_id(op, {}, json.dumps({"ok": True, "channel": "C1", "ts": "17.5"}).encode()) == "C1:17.5"
    assert response_external_id(op, {}, json.dumps({"ok": True, "channel": "C1"}).encode()) is None
    sendgrid = op_of(
        HEAD + "operations:\n  send:\n    match: {method: POST, path: /v3/mail/send}\n"
        "    external_id: {header: X-Message-Id}\n"
    )
    assert sendgrid.external_id_header == "x-message-id"
    assert response_external_id(sendgrid, {"x-message-id": "abc.123"}, b"") == "abc.123"
    assert response_external_id(sendgrid, {}, b"") is None


# --- loader errors for the new features ----------------------------------------------------------

OP = "operations.x"


@pytest.mark.parametrize(
    "body, line, field, message",
    [
        (
            "    match: {method: PUT, path: /graphql, graphql: issueCreate}\n",
            5,
            f"{OP}.match.graphql",
            "use method: POST",
        ),
        (
            "    match: {method: POST, path: /graphql, graphql: issue-create}\n",
            5,
            f"{OP}.match.graphql",
            "not a GraphQL field name",
        ),
        (
            "    match: {method: POST, path: /x}\n    classify: [{state: rejected}]\n",
            6,
            f"{OP}.classify[0]",
            "tests nothing",
        ),
        (
            "    match: {method: POST, path: /x}\n    classify: [{status: 200, body: {msg: {matches: '('}}, state: "
            "rejected}]\n",
            6,
            f"{OP}.classify[0].body.msg.matches",
            "not a valid regular expression",
        ),
        (
            "    match: {method: POST, path: /x}\n    classify: [{status: 200, body: {msg: {contains: a, present: "
            "true}}, state: rejected}]\n",
            6,
            f"{OP}.classify[0].body.msg",
            "expected one test",
        ),
        (
            "    match: {method: POST, path: /x}\n    classify: [{status: 4x, state: rejected}]\n",
            6,
            f"{OP}.classify[0].status",
            "not a status code",
        ),
        (
            "    match: {method: POST, path: /x}\n    classify: [{status: 422, state: already_exists}]\n",
            6,
            f"{OP}.classify",
            "needs a reconcile read",
        ),
        (
            "    match: {method: POST, path: /x}\n    classify: {422: already_exists}\n",
            6,
            f"{OP}.classify",
            "needs a reconcile read",
        ),
        (
            "    match: {method: POST, path: /x}\n    idempotency_key: {header: Idempotency-Key, body: id}\n",
            6,
            f"{OP}.idempotency_key",
            "exactly one place",
        ),
        (
            "    match: {method: POST, path: /x}\n    idempotency_key: {body: id, format: uuid7}\n",
            6,
            f"{OP}.idempotency_key.format",
            "not one of receipt, uuid4",
        ),
        (
            "    match: {method: POST, path: /graphql, graphql: issueCreate}\n    idempotency_key: {body: id}\n",
            6,
            f"{OP}.idempotency_key.body",
            "inside an argument",
        ),
        (
            "    match: {method: POST, path: /x}\n    external_id: {header: 'bad header'}\n",
            6,
            f"{OP}.external_id.header",
            "not a valid header",
        ),
        (
            "    match: {method: POST, path: /x}\n    reconcile:\n      read: {url: /x, body: {a: 1}}\n",
            7,
            f"{OP}.reconcile.read.body",
            "only a POST read does",
        ),
        (
            "    match: {method: POST, path: /x}\n    reconcile:\n      read: {method: POST, url: /search, body: {a: "
            "1}}\n",
            7,
            f"{OP}.reconcile.read.method",
            "listed in post_reads (listed: none)",
        ),
        (
            "    match: {method: POST, path: /x}\n    reconcile:\n      read: {url: /x}\n      settle: 5m\n",
            8,
            f"{OP}.reconcile.settle",
            "needs absence_provable: true",
        ),
        (
            "    match: {method: POST, path: /x}\n    reconcile:\n      read: {url: /x}\n      absence_provable: "
            "true\n      settle: soon\n",
            9,
            f"{OP}.reconcile.settle",
            "expected a duration",
        ),
        (
            "    match: {method: POST, path: /x}\n    reconcile:\n      read: {url: '/x?k={idempotency_key}'}\n",
            7,
            f"{OP}.reconcile.read.url",
            "{idempotency_key} is not recorded",
        ),
    ],
)
def test_new_features_refuse_bad_values_with_line_and_field(body, line, field, message):
    with pytest.raises(RulesError) as info:
        rules(HEAD + "operations:\n  x:\n" + body)
    assert (info.value.line, info.value.field) == (line, field)
    assert message in info.value.message


POST_READS = (
    HEAD
    + """\
post_reads: [/graphql, "/v1/data_sources/{id}/query"]
operations:
  x:
    match: {method: POST, path: /graphql, graphql: issueCreate}
    fingerprint: {body: [input.title]}
    idempotency_key: {body: input.id, format: uuid4}
    reconcile:
      read:
        method: POST
        url: /graphql
        body:
          query: "query Q($id: String!) { issue(id: $id) { id } }"
          variables: {id: "{idempotency_key}", since: "{submitted_at_unix}"}
      items: data.issue
      find: {id: "{idempotency_key}"}
      absent_when: {body: {"errors.*.extensions.code": ENTITY_NOT_FOUND}}
      absence_provable: true
      retry_when_absent: true
"""
)


def test_a_post_read_to_a_listed_path_loads_and_renders_its_body():
    op = op_of(POST_READS)
    r = Receipt(
        operation_id="r1",
        api="demo",
        operation="x",
        method="POST",
        target="https://api.demo.test/graphql",
        state=State.RECONCILING,
        intent_fingerprint="sha256:x",
        intent={"body": {"input.title": "T"}},
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
        idempotency_key="6f1c8a4e-1111-4222-8333-444455556666",
    )
    read = plan_read(op, r)
    assert read is not None and read.body is not None
    assert (read.method, read.url) == ("POST", "https://api.demo.test/graphql")
    doc = json.loads(read.body)
    assert doc["query"].startswith("query Q")  # sent as written: its braces are GraphQL, not templates
    assert doc["variables"] == {
        "id": "6f1c8a4e-1111-4222-8333-444455556666",
        "since": int(dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC).timestamp()),
    }
    _check(read, rules(POST_READS).post_reads)  # a query to a listed path: allowed
    found = json.dumps({"data": {"issue": {"id": "6f1c8a4e-1111-4222-8333-444455556666"}}}).encode()
    assert judge(op.reconcile, read, r, 200, found).state is State.SUCCEEDED
    missing = json.dumps(
        {"data": None, "errors": [{"message": "Entity not found", "extensions": {"code": "ENTITY_NOT_FOUND"}}]}
    ).encode()
    assert judge(op.reconcile, read, r, 200, missing).state is State.SAFE_TO_RETRY
    other = json.dumps(
        {"data": None, "errors": [{"message": "Rate limited", "extensions": {"code": "RATELIMITED"}}]}
    ).encode()
    assert judge(op.reconcile, read, r, 200, other).state is State.OUTCOME_UNKNOWN  # a failed read proves nothing


def test_a_graphql_read_holding_a_mutation_is_refused_when_loading_and_before_sending():
    text = POST_READS.replace(
        "query Q($id: String!) { issue(id: $id) { id } }", 'mutation M { issueDelete(id: \\"x\\") { success } }'
    )
    with pytest.raises(RulesError) as info:
        rules(text)
    assert info.value.field == "operations.x.reconcile.read.body.query" and "holds a mutation" in info.value.message
    post_reads = rules(POST_READS).post_reads
    mutation = json.dumps({"query": 'mutation { issueDelete(id: "x") { success } }'}).encode()
    with pytest.raises(ReconcileError, match="mutation"):
        _check(ReadRequest("POST", "https://api.demo.test/graphql", mutation), post_reads)
    with pytest.raises(ReconcileError, match="never a write"):
        _check(ReadRequest("POST", "https://api.demo.test/v1/pages", b"{}"), post_reads)
    with pytest.raises(ReconcileError, match="never a write"):
        _check(ReadRequest("PUT", "https://api.demo.test/graphql", None), post_reads)


# --- settle ---------------------------------------------------------------------------------------

SETTLE = (
    HEAD
    + """\
operations:
  x:
    match: {method: POST, path: /messages}
    fingerprint: {body: [to]}
    reconcile:
      read: {url: "/events?to={intent.to}"}
      find: {to: "{intent.to}"}
      absence_provable: true
      settle: 30m
      retry_when_absent: true
"""
)


def _unknown(completed_at: str | None) -> Receipt:
    return Receipt(
        operation_id="r2",
        api="demo",
        operation="x",
        method="POST",
        target="https://api.demo.test/messages",
        state=State.RECONCILING,
        intent_fingerprint="sha256:y",
        intent={"body": {"to": "a@b.test"}},
        principal="anonymous",
        submitted_at="2026-11-29T10:00:00.000000Z",
        updated_at="",
        completed_at=completed_at,
        http_status=None,
        error=None,
        external_id=None,
        flow_id=None,
        retry_of=None,
        instance=None,
    )


def test_before_settle_not_found_stays_unknown_and_says_when():
    op = op_of(SETTLE)
    assert op.reconcile.settle == 1800
    r = _unknown("2026-11-29T10:00:05.000000Z")
    read = plan_read(op, r)
    t = dt.datetime(2026, 11, 29, 10, 10, tzinfo=dt.UTC)
    v = judge(op.reconcile, read, r, 200, b"[]", now=t)
    assert v.state is State.OUTCOME_UNKNOWN
    assert v.retry_after == dt.datetime(2026, 11, 29, 10, 30, 5, tzinfo=dt.UTC)
    assert "try again after 2026-11-29T10:30:05" in v.reason
    found = json.dumps([{"to": "a@b.test"}]).encode()
    assert judge(op.reconcile, read, r, 200, found, now=t).state is State.SUCCEEDED  # presence counts at once
    later = t + dt.timedelta(minutes=21)
    assert judge(op.reconcile, read, r, 200, b"[]", now=later).state is State.SAFE_TO_RETRY


# --- GraphQL ---------------------------------------------------------------------------------------

LINEARISH = (
    HEAD.replace("api.demo.test", "api.linear.test")
    + """\
post_reads: [/graphql]
operations:
  issues.create:
    match: {method: POST, path: /graphql, graphql: issueCreate}
    fingerprint: {body: [input.title, input.teamId]}
    idempotency_key: {body: input.id, format: uuid4}
  comments.create:
    match: {method: POST, path: /graphql, graphql: commentCreate}
"""
)

WITH_VARIABLES: dict[str, Any] = {
    "query": "mutation createIssue($input: IssueCreateInput!) { issueCreate(input: $input) { success issue { id } } }",
    "operationName": "createIssue",
    "variables": {"input": {"title": "Crash on save", "teamId": "T1", "description": "ignored"}},
}
INLINE = {"query": 'mutation { issueCreate(input: {title: "Crash on save", teamId: "T1"}) { success } }'}


def _gql(doc: dict) -> bytes:
    return json.dumps(doc).encode()


def test_graphql_mutations_match_by_root_field_not_operation_name():
    rs = RuleSet.of([rules(LINEARISH)])
    pending = rs.match("api.linear.test", 443, "POST", "/graphql")
    assert pending is not None and pending.pending
    m = rs.match("api.linear.test", 443, "POST", "/graphql", body=_gql(WITH_VARIABLES))
    assert m is not None and m.graphql_args is not None
    assert m.operation.name == "issues.create" and m.graphql_args["input"]["title"] == "Crash on save"
    m = rs.match("api.linear.test", 443, "POST", "/graphql", body=_gql(INLINE))
    assert m is not None and m.operation.name == "issues.create"
    comment = {"query": 'mutation issueCreate { commentCreate(input: {body: "x"}) { success } }'}
    m = rs.match("api.linear.test", 443, "POST", "/graphql", body=_gql(comment))
    assert m is not None and m.operation.name == "comments.create"
    query = {"query": "query issueCreate { issues { nodes { id } } }"}
    assert rs.match("api.linear.test", 443, "POST", "/graphql", body=_gql(query)) is None
    not_json = rs.match("api.linear.test", 443, "POST", "/graphql", body=b"not json")
    assert not_json is not None and not_json.refused is not None
    assert not_json.refused_as == "bad_json" and "not JSON" in not_json.refused  # a server may read it otherwise: 400
    two = {
        "query": 'mutation A { issueCreate(input: {title: "a"}) { success } } query B { viewer { id } }',
        "operationName": "B",
    }
    assert rs.match("api.linear.test", 443, "POST", "/graphql", body=_gql(two)) is None  # B runs, a query
    fragment = {"query": 'mutation { ...F } fragment F on Mutation { issueCreate(input: {title: "f"}) { success } }'}
    m = rs.match("api.linear.test", 443, "POST", "/graphql", body=_gql(fragment))
    assert m is not None and m.operation.name == "issues.create"


def test_graphql_variables_and_inline_arguments_fingerprint_alike():
    rs = RuleSet.of([rules(LINEARISH)])
    prints = []
    for doc in (WITH_VARIABLES, INLINE):
        body = _gql(doc)
        m = rs.match("api.linear.test", 443, "POST", "/graphql", body=body)
        assert m is not None
        view = RequestView(
            "POST", "https", "api.linear.test", 443, "/graphql", {"content-type": "application/json"}, body
        )
        prints.append(fingerprint(m, view, KEY))
    assert prints[0].fingerprint == prints[1].fingerprint
    assert prints[0].intent["body"] == {"input.title": "Crash on save", "input.teamId": "T1"}


def test_a_proxy_chosen_id_goes_into_the_variable_or_is_kept_from_the_agent():
    op = rules(LINEARISH).operations[0]
    body = _gql(WITH_VARIABLES)
    assert identity.body_key(op, body, WITH_VARIABLES["variables"]) == (None, True)
    sent_body = identity.with_body_key(op, body, "uuid-1")
    assert sent_body is not None
    sent = json.loads(sent_body)
    assert sent["variables"]["input"]["id"] == "uuid-1" and sent["variables"]["input"]["title"] == "Crash on save"
    own = json.loads(json.dumps(WITH_VARIABLES))
    own["variables"]["input"]["id"] = "agent-uuid"
    assert identity.body_key(op, _gql(own), own["variables"]) == ("agent-uuid", True)
    # An inline argument: the id is written into the document itself.
    assert identity.body_key(op, _gql(INLINE), {"input": {"title": "Crash on save"}}) == (None, True)
    sent_body = identity.with_body_key(op, _gql(INLINE), "uuid-1")
    assert sent_body is not None
    sent = json.loads(sent_body)
    fields = gql.mutation_fields(json.dumps(sent).encode())
    assert fields is not None
    assert fields["issueCreate"]["input"] == {"title": "Crash on save", "teamId": "T1", "id": "uuid-1"}
    # No input at all, or one behind a fragment: no place for an id, the request goes as it is.
    bare = {"query": "mutation { issueCreate { success } }"}
    assert identity.body_key(op, _gql(bare), {}) == (None, False)
    fragment = {"query": 'mutation { ...F } fragment F on Mutation { issueCreate(input: {title: "f"}) { success } }'}
    assert identity.with_body_key(op, _gql(fragment), "uuid-1") is None


def test_gql_read_is_query():
    assert gql.read_is_query("query { viewer { id } }") is None
    assert "mutation" in (gql.read_is_query("mutation { a }") or "")
    assert "does not parse" in (gql.read_is_query("query {") or "")


# --- multipart -------------------------------------------------------------------------------------


def _multipart(purpose: str, content: bytes, filename: str = "batch.jsonl") -> tuple[str, bytes]:
    req = httpx.Request(
        "POST",
        "https://api.demo.test/v1/files",
        data={"purpose": purpose},
        files={"file": (filename, content, "application/jsonl")},
    )
    return req.headers["content-type"], req.read()


def test_multipart_parts_hash_files_and_keep_text():
    ctype, body = _multipart("batch", b'{"custom_id": "1"}\n')
    parts = multipart_parts(ctype, body)
    assert parts is not None
    assert parts["purpose"] == "batch"
    assert parts["file"]["filename"] == "batch.jsonl" and parts["file"]["size"] == 19
    assert len(parts["file"]["sha256"]) == 64 and "custom_id" not in json.dumps(parts)
    assert multipart_parts(ctype, body[:-20]) is None  # truncated: no closing delimiter
    assert multipart_parts("multipart/form-data", body) is None  # no boundary


def test_multipart_fingerprints_by_file_content_never_storing_it():
    op = op_of(
        HEAD + "operations:\n  files:\n    match: {method: POST, path: /v1/files}\n"
        "    fingerprint: {body: [purpose, file.sha256]}\n"
    )

    def fp(purpose, content, filename="batch.jsonl"):
        ctype, body = _multipart(purpose, content, filename)
        view = RequestView("POST", "https", "api.demo.test", 443, "/v1/files", {"content-type": ctype}, body)
        return fingerprint(Match(op, {}), view, KEY)

    a = fp("batch", b"line one SECRET-CONTENT\n")
    assert a.fingerprint == fp("batch", b"line one SECRET-CONTENT\n", "renamed.jsonl").fingerprint  # name not listed
    assert a.fingerprint != fp("batch", b"line two\n").fingerprint
    assert a.fingerprint != fp("fine-tune", b"line one SECRET-CONTENT\n").fingerprint
    assert "SECRET-CONTENT" not in json.dumps(a.intent)


def test_a_read_sends_the_rules_own_headers_but_never_a_credential_written_in_the_file():
    text = (
        HEAD
        + """\
credentials: {header: api-key}
operations:
  x:
    match: {method: POST, path: /pages}
    fingerprint: {body: [title]}
    reconcile:
      read: {url: /pages, headers: {Notion-Version: "2025-09-03", X-Title: "{intent.title}"}}
      find: {title: "{intent.title}"}
"""
    )
    op = op_of(text)
    r = _unknown(None)
    r = Receipt(**{**r.__dict__, "intent": {"body": {"title": "Plan"}}})
    read = plan_read(op, r)
    assert read.headers == (("notion-version", "2025-09-03"), ("x-title", "Plan"))
    for name in ("Authorization", "api-key", "X-Api-Token"):
        with pytest.raises(RulesError) as info:
            rules(text.replace("Notion-Version", name))
        assert (
            info.value.field == f"operations.x.reconcile.read.headers.{name}"
            and "carries credentials" in info.value.message
        )


def test_a_found_id_may_take_a_part_from_the_receipt():
    text = SLACKISH.replace(
        """      find: {text: "{intent.text}"}""",
        """      find: {text: "{intent.text}"}
      external_id: ["{intent.channel}", ts]""",
    )
    op = op_of(text)
    r = _unknown(None)
    r = Receipt(**{**r.__dict__, "intent": {"body": {"channel": "C9", "text": "hi"}}})
    read = plan_read(op, r)
    found = json.dumps({"ok": True, "messages": [{"text": "hi", "ts": "17.5"}]}).encode()
    v = judge(op.reconcile, read, r, 200, found)
    assert (v.state, v.external_id) == (State.SUCCEEDED, "C9:17.5")
    with pytest.raises(RulesError) as info:
        op_of(text.replace("{intent.channel}", "{intent.team}"))
    assert info.value.field == "operations.post.reconcile.external_id" and "not recorded" in info.value.message


def test_an_idempotency_key_dedupes_only_while_the_api_remembers_it():
    from proxy_addon.reconcile.settle import key_dedupes

    op = op_of(
        HEAD + "operations:\n  pay:\n    match: {method: POST, path: /pay}\n"
        "    idempotency_key: {header: Idempotency-Key, ttl: 24h}\n"
    )
    assert op.idempotency_ttl == 86400
    r = Receipt(**{**_unknown(None).__dict__, "idempotency_key": "receipt-r2"})
    t0 = dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC)
    assert key_dedupes(op, r, t0 + dt.timedelta(hours=23))
    assert not key_dedupes(op, r, t0 + dt.timedelta(hours=24, seconds=1))
    assert not key_dedupes(op, Receipt(**{**r.__dict__, "idempotency_key": None}), t0)


def test_submitted_at_templates_are_whole_seconds_from_the_first_use_of_a_reused_key():
    op = op_of(
        HEAD + "operations:\n  pay:\n    match: {method: POST, path: /pay}\n"
        "    idempotency_key: {header: Idempotency-Key}\n"
        "    reconcile:\n      read: {url: '/pay?created[gte]={submitted_at_unix}&since={submitted_at}'}\n"
    )
    r = Receipt(
        **{
            **_unknown(None).__dict__,
            "submitted_at": "2026-11-29T12:00:00.750000Z",
            "idempotency_key": "receipt-r1",
            "idempotency_key_at": "2026-11-29T10:00:00.250000Z",
        }
    )
    first = int(dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC).timestamp())
    assert plan_read(op, r).url == f"https://api.demo.test/pay?created[gte]={first}&since=2026-11-29T10%3A00%3A00Z"


def test_find_bounds_keep_an_older_identical_object_from_counting():
    text = (
        HEAD
        + """\
operations:
  files:
    match: {method: POST, path: /v1/files}
    fingerprint: {body: [purpose]}
    reconcile:
      read: {url: /v1/files}
      items: data
      find: {purpose: "{intent.purpose}", created_at: {gte: "{submitted_at_unix}"}}
      external_id: id
"""
    )
    op = op_of(text)
    assert op.reconcile.bounds == (("created_at", "gte", "{submitted_at_unix}"),)
    r = Receipt(**{**_unknown(None).__dict__, "intent": {"body": {"purpose": "batch"}}})
    at = int(dt.datetime(2026, 11, 29, 10, tzinfo=dt.UTC).timestamp())
    read = plan_read(op, r)

    def verdict(*items):
        return judge(op.reconcile, read, r, 200, json.dumps({"data": list(items)}).encode())

    old = {"id": "file-old", "purpose": "batch", "created_at": at - 60}
    new = {"id": "file-new", "purpose": "batch", "created_at": at + 2}
    assert (verdict(old).state, verdict(old, new).external_id) == (State.MANUAL_REVIEW, "file-new")
    iso_item = {"id": "file-iso", "purpose": "batch", "created_at": "2026-11-29T10:00:05Z"}
    assert verdict(iso_item).external_id == "file-iso"
    assert verdict({"id": "x", "purpose": "batch"}).state is State.MANUAL_REVIEW  # no created_at: no fit
    with pytest.raises(RulesError) as info:
        op_of(text.replace("{gte:", "{after:"))
    assert (
        info.value.field == "operations.files.reconcile.find.created_at.after" and "unknown key" in info.value.message
    )
