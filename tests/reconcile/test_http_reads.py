"""
The reconcile spec in rules files, and the reconciler's pure parts: templates, plans, verdicts; a read
refuses any method but GET and HEAD before it sends (the upstream of tests/upstream.py counts what it saw).
Reconciling through a real proxy and the CLI: tests/e2e/reconcile/test_reconcile.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest

from proxy_addon.errors import ReconcileError, RulesError
from proxy_addon.reconcile.http_reads import ReadRequest, perform_read, plan_read, render
from proxy_addon.reconcile.judge import absence_provable_from, judge, landed_by
from proxy_addon.rules import load_rules
from proxy_addon.states import State
from proxy_addon.store import Receipt

BASE = """\
api: blog
hosts: [blog.test]
credentials: {header: api-key, env: BLOG_KEY}
operations:
  posts.create:
    match: {method: POST, path: "/v1/{team}/posts"}
    fingerprint: {body: [post.title, post.slug]}
    external_id: id
    reconcile:
      read: {method: GET, url: "/v1/{path.team}/posts?slug={intent.post.slug}&per_page=100"}
      items: data
      find: {title: "{intent.post.title}", slug: "{intent.post.slug}"}
      absence_provable: true
      retry_when_absent: true
"""


def op_of(text: str = BASE):
    return load_rules(text, "blog.yaml").operations[0]


def receipt(intent: dict, external_id: str | None = None) -> Receipt:
    return Receipt(
        operation_id="20261129T000000Z-abc",
        api="blog",
        operation="posts.create",
        method="POST",
        target="https://blog.test/v1/red/posts?token=REDACTED",
        state=State.RECONCILING,
        intent_fingerprint="sha256:x",
        intent=intent,
        principal="anonymous",
        submitted_at="2026-11-29T00:00:00.000000Z",
        updated_at="",
        completed_at="2026-11-29T00:00:01.000000Z",
        http_status=None,
        error=None,
        external_id=external_id,
        flow_id=None,
        retry_of=None,
        instance=None,
    )


INTENT = {"path": {"team": "red"}, "body": {"post.title": "Hello & bye", "post.slug": "hello-bye"}}


def test_the_spec_loads_with_defaults():
    spec = op_of().reconcile
    assert (spec.method, spec.items, spec.absence_provable, spec.retry_when_absent, spec.external_id) == (
        "GET",
        "data",
        True,
        True,
        "id",
    )  # external_id defaults to the operation's
    assert op_of().credentials_env == "BLOG_KEY"


@pytest.mark.parametrize(
    "old, new, line, field, message",
    [
        ("{method: GET,", "{method: POST,", 10, "reconcile.read.method", "never a write"),
        ("{method: GET,", "{method: DELETE,", 10, "reconcile.read.method", "GET or HEAD"),
        (
            '{intent.post.title}"',
            '{intent.post.body}"',
            12,
            "reconcile.find.title",
            "not recorded by this operation's fingerprint",
        ),
        ("{path.team}", "{path.org}", 10, "reconcile.read.url", "{path.org} is not recorded"),
        ("{path.team}", "{path.team", 10, "reconcile.read.url", "unbalanced"),
        ('url: "/v1', 'url: "ftp://x/v1', 10, "reconcile.read.url", "must be a path"),
        (
            "absence_provable: true",
            "absence_provable: false",
            14,
            "reconcile.retry_when_absent",
            "needs absence_provable",
        ),
        (
            "absence_provable: true",
            "absence_provable: yes please",
            13,
            "reconcile.absence_provable",
            "expected true or false",
        ),
        ("      items: data\n", "      itemz: data\n", 11, "reconcile.itemz", "unknown key"),
        ("{method: GET,", "{method: HEAD,", 12, "reconcile.find", "HEAD read has no body"),
        ("BLOG_KEY", "BLOG-KEY", 3, "credentials.env", "not an environment variable name"),
    ],
    ids=[
        "post",
        "delete",
        "unknown-intent-field",
        "unknown-path-param",
        "unbalanced",
        "bad-scheme",
        "retry-without-proof",
        "not-a-bool",
        "unknown-key",
        "head-with-find",
        "bad-env-name",
    ],
)
def test_bad_specs_name_line_and_field(old, new, line, field, message):
    assert old in BASE
    with pytest.raises(RulesError) as e:
        load_rules(BASE.replace(old, new, 1), "blog.yaml")
    assert e.value.line == line
    assert e.value.field is not None and e.value.field.endswith(field)
    assert message in e.value.message


def test_idempotency_key_spec():
    text = BASE.replace(
        "    external_id: id\n", "    external_id: id\n    idempotency_key: {header: Idempotency-Key}\n", 1
    )
    assert op_of(text).idempotency_header == "Idempotency-Key"
    with pytest.raises(RulesError, match=r"idempotency_key.header"):
        load_rules(text.replace("{header: Idempotency-Key}", "{header: 'bad header'}"), "blog.yaml")


def test_plan_read_renders_and_url_encodes_from_the_receipt():
    read = plan_read(op_of(), receipt(INTENT))
    assert read == ReadRequest("GET", "https://blog.test/v1/red/posts?slug=hello-bye&per_page=100")
    odd = {**INTENT, "body": {**INTENT["body"], "post.slug": "a b/c?d"}}
    assert plan_read(op_of(), receipt(odd)).url.endswith("slug=a%20b%2Fc%3Fd&per_page=100")


def test_render_refuses_a_missing_value():
    with pytest.raises(ReconcileError, match="has no value"):
        render("{external_id}", receipt(INTENT))
    assert render("{external_id}", receipt(INTENT, external_id="42")) == "42"


def answer(*items) -> bytes:
    return json.dumps({"data": list(items)}).encode()


FOUND = {"id": 7, "title": "Hello & bye", "slug": "hello-bye"}


@pytest.mark.parametrize(
    "status, body, state, external_id, reason",
    [
        (200, answer(FOUND), State.SUCCEEDED, "7", "found among 1 items (id=7)"),
        (200, answer({"id": 8, "title": "Hello & bye", "slug": "other"}, FOUND), State.SUCCEEDED, "7", "found among 2"),
        (200, answer({"id": 8, "title": "Other", "slug": "hello-bye"}), State.SAFE_TO_RETRY, None, "absence is proven"),
        (200, answer(), State.SAFE_TO_RETRY, None, "not found among 0 items"),
        # a failed read proves nothing: the outcome stays unknown (reconcile.py counts it, and may
        # send the receipt to manual_review after enough of them)
        (500, b"oops", State.OUTCOME_UNKNOWN, None, "HTTP 500: the read failed"),
        (404, b"", State.OUTCOME_UNKNOWN, None, "the read failed"),
        (200, b"<html>", State.OUTCOME_UNKNOWN, None, "not JSON"),
        (200, b'{"items": []}', State.OUTCOME_UNKNOWN, None, "no list at data"),
    ],
    ids=["found", "found-second", "absent", "empty", "500", "404-with-find", "not-json", "no-list"],
)
def test_judge_with_find(status, body, state, external_id, reason):
    op = op_of()
    read = plan_read(op, receipt(INTENT))
    v = judge(op.reconcile, read, receipt(INTENT), status, body)
    assert (v.state, v.external_id) == (state, external_id)
    assert v.failed is (state is State.OUTCOME_UNKNOWN)
    assert reason in v.reason
    assert v.reason.startswith(f"read GET {read.url} → HTTP {status}")


def recovered(**kw) -> Receipt:
    """A receipt taken over from a proxy that went silent: nobody saw its attempt end (no completed_at)."""
    fields = {
        "completed_at": None,
        "state": State.RECONCILING,
        "upstream_timeout": 300.0,
        "submitted_at": "2026-11-29T10:00:00.000000Z",
        "in_flight_until": "2026-11-29T10:05:00.000000Z",
    }
    return Receipt(**{**receipt(INTENT).__dict__, **fields, **kw})


def test_a_read_proves_absence_only_after_the_original_can_no_longer_land():
    """Issue 24: a takeover read of a receipt whose proxy went silent finds nothing, but the original may still be
    held open until its in_flight_until (its proxy's upstream timeout after it was sent), plus a margin: nothing
    is proven before then; a found effect counts at once."""
    op, r = op_of(), recovered()
    read = plan_read(op, r)
    lands_by = dt.datetime(2026, 11, 29, 10, 5, 2, tzinfo=dt.UTC)  # in_flight_until + 2 s
    assert landed_by(r) == absence_provable_from(op.reconcile, r) == lands_by
    early = judge(op.reconcile, read, r, 200, answer(), now=lands_by - dt.timedelta(seconds=1))
    assert (early.state, early.retry_after, early.failed) == (State.OUTCOME_UNKNOWN, lands_by, False)
    assert "the original request may still land until 2026-11-29T10:05:02" in early.reason
    assert "its upstream timeout: 300s, plus 2s" in early.reason
    assert (
        judge(op.reconcile, read, r, 200, answer(FOUND), now=lands_by - dt.timedelta(seconds=1)).state
        is State.SUCCEEDED
    )
    assert judge(op.reconcile, read, r, 200, answer(), now=lands_by).state is State.SAFE_TO_RETRY


def test_an_attempt_its_proxy_saw_end_is_judged_from_its_end_and_settle_counts_after_the_lifetime():
    op, r = op_of(), recovered(completed_at="2026-11-29T10:00:01.000000Z")  # its own proxy recorded the outcome
    read = plan_read(op, r)
    assert (
        judge(op.reconcile, read, r, 200, answer(), now=dt.datetime(2026, 11, 29, 10, 0, 2, tzinfo=dt.UTC)).state
        is State.SAFE_TO_RETRY
    )  # the connection closed at completed_at: no lifetime to wait out
    settled = op_of(BASE.replace("retry_when_absent: true", "retry_when_absent: true\n      settle: 60s"))
    assert absence_provable_from(settled.reconcile, recovered()) == dt.datetime(2026, 11, 29, 10, 6, 2, tzinfo=dt.UTC)
    # a receipt an earlier version recorded, without a timeout: the default one (300 s)
    legacy = recovered(upstream_timeout=None, in_flight_until=None)
    assert landed_by(legacy) == dt.datetime(2026, 11, 29, 10, 5, 2, tzinfo=dt.UTC)
    assert (
        "its upstream timeout: unrecorded"
        in judge(op.reconcile, read, legacy, 200, answer(), now=dt.datetime(2026, 11, 29, 10, 1, tzinfo=dt.UTC)).reason
    )


STATUS_ONLY = """\
api: blog
hosts: [blog.test]
operations:
  posts.update:
    match: {method: PUT, path: "/v1/posts/{id}"}
    fingerprint: {path: [id], body: [title]}
    reconcile:
      read: {method: HEAD, url: "/v1/posts/{path.id}?rev={intent.title}"}
      absence_provable: PROVABLE
"""


@pytest.mark.parametrize(
    "provable, status, state",
    [
        ("true", 200, State.SUCCEEDED),
        ("true", 404, State.MANUAL_REVIEW),
        ("false", 410, State.MANUAL_REVIEW),
        ("true", 503, State.OUTCOME_UNKNOWN),
    ],  # a failed read proves nothing
    ids=["2xx-found", "404-provable-but-no-retry", "410-not-provable", "503"],
)
def test_judge_by_status(provable, status, state):
    op = op_of(STATUS_ONLY.replace("PROVABLE", provable))
    r = receipt({"path": {"id": "9"}, "body": {"title": "v2"}})
    read = plan_read(op, r)
    assert read == ReadRequest("HEAD", "https://blog.test/v1/posts/9?rev=v2")
    assert judge(op.reconcile, read, r, status, b"").state is state


def test_secrets_in_the_read_url_are_redacted_in_the_reason():
    # keep: what the read template writes; a credential-looking name stays redacted even there.
    read = ReadRequest("GET", "https://blog.test/v1/posts?access_token=s3cr3t&page=2", keep=("access_token", "page"))
    v = judge(op_of().reconcile, read, receipt(INTENT), 500, b"")
    assert "s3cr3t" not in v.reason
    assert "access_token=REDACTED&page=2" in v.reason


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
def test_perform_read_refuses_anything_but_get_and_head(method):
    with pytest.raises(ReconcileError, match="never a write"):
        asyncio.run(perform_read(ReadRequest(method, "http://127.0.0.1:9/never"), {}))


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_perform_read_refuses_writes(method, upstream):
    with pytest.raises(ReconcileError, match="never a write"):
        asyncio.run(perform_read(ReadRequest(method, f"{upstream.url}/api/x/things"), {}))
    assert upstream.seen("/api/x/things") == 0
