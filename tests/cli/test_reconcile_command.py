"""`receipts reconcile`: what a read decides, for one receipt, several and --all."""

from __future__ import annotations

import json

import pytest

from proxy_addon.gate.paths import DEFAULT_RULES
from proxy_addon.rules import load_rules_path
from proxy_addon.states import State
from proxy_addon.store import Store
from tests.cli.conftest import dump

RECONCILING_REASON = "reconciling with a read"


def history(store: Store, rid: str) -> list[tuple[str | None, str, str, str]]:
    return [(e.from_state, e.to_state, e.reason, e.actor) for e in store.events(rid)]


# Each case: the receipt's kind (/api/<bucket>/<kind>, operation <kind>.create) and title, the
# titles already on the upstream, a fault for the read, more argv, the receipt's (api, operation)
# when not the kind's, then the expected state, external id and reason ({read} is "read GET <url>"),
# and the read's path after /api/<bucket>/<kind> (None: no read is sent). SAME: a failed read proves
# nothing, so the receipt stays in the state it started in (outcome_unknown, waiting for its next read).
SAME = "same as before"
RECONCILE_CASES = [
    pytest.param(
        "things",
        "x",
        ["a", "x", "b"],
        None,
        [],
        None,
        "succeeded",
        "2",
        "{read} → HTTP 200: found among 3 items (id=2)",
        "",
        id="found",
    ),
    pytest.param(
        "notes",
        "x",
        ["x"],
        None,
        [],
        None,
        "succeeded",
        "1",
        "{read} → HTTP 200: found among 1 items (id=1)",
        "",
        id="found-in-a-list-that-proves-nothing-absent",
    ),
    pytest.param(
        "things",
        "x",
        ["a", "b"],
        None,
        [],
        None,
        "safe_to_retry",
        None,
        "{read} → HTTP 200: not found among 2 items; absence is proven and the rule allows a retry",
        "",
        id="absent-provable",
    ),
    pytest.param(
        "things",
        "x",
        [],
        None,
        [],
        None,
        "safe_to_retry",
        None,
        "{read} → HTTP 200: not found among 0 items; absence is proven and the rule allows a retry",
        "",
        id="absent-from-an-empty-list",
    ),
    pytest.param(
        "notes",
        "x",
        ["a"],
        None,
        [],
        None,
        "manual_review",
        None,
        "{read} → HTTP 200: not found among 1 items; the rule does not say this read proves absence",
        "",
        id="absent-not-provable",
    ),
    pytest.param(
        "drafts",
        "x",
        ["a"],
        None,
        [],
        None,
        "manual_review",
        None,
        "{read} → HTTP 200: not found among 1 items; the rule does not allow a retry",
        "",
        id="absent-provable-but-no-retry-allowed",
    ),
    pytest.param(
        "things",
        "x",
        ["x"],
        "500",
        [],
        None,
        SAME,
        None,
        "{read} → HTTP 500: the read failed, nothing is proven",
        "",
        id="read-answers-500",
    ),
    pytest.param(
        "things",
        "x",
        ["x"],
        "404",
        [],
        None,
        SAME,
        None,
        "{read} → HTTP 404: the read failed, nothing is proven",
        "",
        id="list-read-answers-404",
    ),
    pytest.param(
        "things",
        "x",
        ["x"],
        "hang",
        ["--timeout", "0.1"],
        None,
        SAME,
        None,
        "{read} failed: ReadTimeout",
        "",
        id="read-times-out",
    ),
    pytest.param(
        "lookups",
        "2",
        ["a", "b"],
        None,
        [],
        None,
        "succeeded",
        "2",
        "{read} → HTTP 200: found",
        "/2",
        id="status-decides-found",
    ),
    pytest.param(
        "lookups",
        "3",
        ["a", "b"],
        None,
        [],
        None,
        "safe_to_retry",
        None,
        "{read} → HTTP 404; absence is proven and the rule allows a retry",
        "/3",
        id="status-decides-absent",
    ),
    pytest.param(
        "lookups",
        "2",
        ["a", "b"],
        "500",
        [],
        None,
        SAME,
        None,
        "{read} → HTTP 500: the read failed, nothing is proven",
        "/2",
        id="status-decides-500",
    ),
    pytest.param(
        "plain",
        "x",
        ["x"],
        None,
        [],
        None,
        "manual_review",
        None,
        "no read can decide: test-api plain.create has no reconcile spec",
        None,
        id="no-reconcile-spec",
    ),
    pytest.param(
        "things",
        "x",
        ["x"],
        None,
        [],
        ("test-api", "things.archive"),
        "manual_review",
        None,
        "no read can decide: its rule is gone",
        None,
        id="operation-gone-from-the-rules",
    ),
    pytest.param(
        "things",
        "x",
        ["x"],
        None,
        [],
        ("gone-api", "things.create"),
        "manual_review",
        None,
        "no read can decide: its rule is gone",
        None,
        id="api-gone-from-the-rules",
    ),
]


@pytest.mark.parametrize("start", [State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW], ids=str)
@pytest.mark.parametrize("kind, title, items, fault, argv, rule, state, external_id, reason, read", RECONCILE_CASES)
def test_reconcile(recon, capsys, start, kind, title, items, fault, argv, rule, state, external_id, reason, read):
    recon.add(kind, *items)
    api, operation = rule or ("test-api", f"{kind}.create")
    rid = recon.receipt(title, kind=kind, state=start, api=api, operation=operation)
    read_path = None if read is None else recon.api_path(kind) + read
    if fault:
        recon.up.plan_read(read_path, fault)
    before = history(recon.store, rid)
    reason = reason.format(read=f"read GET {recon.up.url}{read_path}")
    if state == SAME:  # the failed read is counted, and an outcome_unknown receipt waits 30 s for its next read
        state = start
        reason += (
            "; failed read 1 of 3: next read not before 2026-03-01T12:00:30.000000Z (backoff)"
            if start is State.OUTCOME_UNKNOWN
            else "; failed read 1: it stays in manual review"
        )
    code, out, err = recon.run(capsys, rid, *argv)
    if "failed" in reason:  # a read that fails proves nothing: said on stderr, and the exit status is 1
        assert (code, err) == (1, f"Error: 1 read failed and proved nothing:\n  {rid} {api}/{operation}: {reason}\n")
    else:
        assert (code, err) == (0, "")  # one receipt: no progress lines
    assert out == f"{rid}  {start} → {state}  {reason}\n"
    r = recon.store.get(rid)
    assert (r.state, r.external_id) == (state, external_id)
    assert history(recon.store, rid) == [
        *before,
        (start, "reconciling", RECONCILING_REASON, "cli:alice"),
        ("reconciling", state, reason, "cli:alice"),
    ]
    assert [(q["method"], q["path"]) for q in recon.gets()] == ([] if read is None else [("GET", read_path)])
    assert recon.up.seen(recon.api_path(kind)) == len(items)  # a read, never another write
    assert len(recon.requests()) == len(items) + (read is not None)


def test_reconcile_safe_to_retry_lets_the_next_identical_request_through(recon, capsys):
    rid = recon.receipt("x")
    attempt_again = recon.attempt("x")
    assert recon.store.begin_attempt(attempt_again).kind == "blocked"
    code, _, _ = recon.run(capsys, rid)
    assert (code, recon.store.get(rid).state) == (0, "safe_to_retry")
    decision = recon.store.begin_attempt(attempt_again)
    assert (decision.kind, decision.receipt.retry_of) == ("forward", rid)


def test_reconcile_json(recon, capsys):
    recon.add("things", "a", "x")
    found = recon.receipt("x")
    unproven = recon.receipt("y", kind="notes", state=State.MANUAL_REVIEW)
    code, out, err = recon.run(capsys, found, unproven, "--json")
    assert code == 0
    assert err == (f"[1/2] {found} test-api/things.create ...\n[2/2] {unproven} test-api/notes.create ...\n")
    results = json.loads(out)
    assert results == [
        {
            "operation_id": found,
            "operation": "test-api/things.create",
            "from": "outcome_unknown",
            "state": "succeeded",
            "external_id": "2",
            "read_failed": False,
            "next_read_at": None,
            "skipped": False,
            "reason": f"{recon.read_of('things')} → HTTP 200: found among 2 items (id=2)",
        },
        {
            "operation_id": unproven,
            "operation": "test-api/notes.create",
            "from": "manual_review",
            "state": "manual_review",
            "external_id": None,
            "read_failed": False,
            "next_read_at": None,
            "skipped": False,
            "reason": f"{recon.read_of('notes')} → HTTP 200: not found among 0 items; "
            "the rule does not say this read proves absence",
        },
    ]
    for result in results:  # what was printed is what was recorded
        r = recon.store.get(result["operation_id"])
        assert (r.state, r.external_id) == (result["state"], result["external_id"])
        assert recon.store.events(r.operation_id)[-1].reason == result["reason"]
    assert (recon.reads("things"), recon.reads("notes"), len(recon.gets())) == (1, 1, 2)


def test_reconcile_several_ids_in_text(recon, capsys):
    recon.add("things", "x")
    first, second = recon.receipt("x"), recon.receipt("y")
    code, out, err = recon.run(capsys, second, first)  # in the order given
    assert code == 0
    assert err == (f"[1/2] {second} test-api/things.create ...\n[2/2] {first} test-api/things.create ...\n")
    read = recon.read_of("things")
    assert out == (
        f"{second}  outcome_unknown → safe_to_retry  {read} → HTTP 200: not found among 1 items; "
        "absence is proven and the rule allows a retry\n"
        f"{first}  outcome_unknown → succeeded  {read} → HTTP 200: found among 1 items (id=1)\n"
    )
    assert recon.reads("things") == 2


def test_reconcile_all(recon, capsys):
    recon.add("things", "found")
    ids = {}
    ids["unknown_found"] = recon.receipt("found")
    ids["review_absent"] = recon.receipt("absent", state=State.MANUAL_REVIEW)
    ids["unknown_unproven"] = recon.receipt("unproven", kind="notes")
    for s in (State.SUCCEEDED, State.SUBMITTED, State.REJECTED, State.NOT_SENT, State.SAFE_TO_RETRY, State.RECONCILING):
        ids[str(s)] = recon.receipt(f"other-{s}", state=s)
    # one already there under the title found: a read would find it
    untouched = {k: v for k, v in ids.items() if k not in ("unknown_found", "review_absent", "unknown_unproven")}
    receipts_before, events_before = dump(recon.path)
    code, out, err = recon.run(capsys, "--all")
    assert code == 0
    order = [ids["unknown_unproven"], ids["review_absent"], ids["unknown_found"]]  # newest first
    ops = ["test-api/notes.create", "test-api/things.create", "test-api/things.create"]
    assert err == "".join(f"[{n}/3] {rid} {op} ...\n" for n, (rid, op) in enumerate(zip(order, ops, strict=True), 1))
    things, notes = recon.read_of("things"), recon.read_of("notes")
    assert out.splitlines() == [
        f"{order[0]}  outcome_unknown → manual_review  {notes} → HTTP 200: not found among 0 items; "
        "the rule does not say this read proves absence",
        f"{order[1]}  manual_review → safe_to_retry  {things} → HTTP 200: not found among 1 items; "
        "absence is proven and the rule allows a retry",
        f"{order[2]}  outcome_unknown → succeeded  {things} → HTTP 200: found among 1 items (id=1)",
    ]
    receipts_after, events_after = dump(recon.path)
    assert [r for r in receipts_after if r[0] in untouched.values()] == [
        r for r in receipts_before if r[0] in untouched.values()
    ]
    assert events_after[: len(events_before)] == events_before
    assert sorted(e[1] for e in events_after[len(events_before) :]) == sorted(order * 2)  # two events each
    assert (recon.reads("things"), recon.reads("notes"), len(recon.gets())) == (2, 1, 3)
    # Again: only the receipt still in manual_review is read again, alone (no progress line).
    code, out, err = recon.run(capsys, "--all")
    assert (code, err) == (0, "")
    assert out == (
        f"{order[0]}  manual_review → manual_review  {notes} → HTTP 200: not found among 0 items; "
        "the rule does not say this read proves absence\n"
    )
    assert (recon.reads("notes"), len(recon.gets())) == (2, 4)


@pytest.mark.parametrize(
    "json_flag, expected",
    [
        pytest.param([], "nothing to reconcile: no outcome_unknown or manual_review receipts\n", id="text"),
        pytest.param(["--json"], "[]\n", id="json"),
    ],
)
def test_reconcile_all_with_nothing_to_do(recon, capsys, json_flag, expected):
    recon.receipt("done", state=State.SUCCEEDED)
    recon.receipt("in-flight", state=State.SUBMITTED)
    before = dump(recon.path)
    code, out, err = recon.run(capsys, "--all", *json_flag)
    assert (code, out, err) == (0, expected, "")
    assert dump(recon.path) == before
    assert recon.requests() == []


def test_reconcile_rules_from_the_environment_and_by_default(recon, capsys, monkeypatch, tmp_path):
    recon.add("things", "x")
    first, second, third = recon.receipt("x"), recon.receipt("y"), recon.receipt("z")
    monkeypatch.setenv("RECEIPT_PROXY_RULES", str(recon.rules))
    code, out, _ = recon.run(capsys, first, rules=False)
    assert code == 0 and "outcome_unknown → succeeded" in out
    monkeypatch.setenv("RECEIPT_PROXY_RULES", str(tmp_path / "missing.yaml"))
    code, out, _ = recon.run(capsys, second)  # --rules beats the environment
    assert code == 0 and "outcome_unknown → safe_to_retry" in out
    monkeypatch.delenv("RECEIPT_PROXY_RULES")
    assert load_rules_path(DEFAULT_RULES).operation("test-api", "things.create") is None  # rules/ knows no test-api
    code, out, _ = recon.run(capsys, third, rules=False)
    assert (code, out) == (0, f"{third}  outcome_unknown → manual_review  no read can decide: its rule is gone\n")
    assert recon.reads("things") == 2


@pytest.mark.parametrize("settled_first", [False, True], ids=["settled-last", "settled-first"])
def test_reconcile_a_settled_receipt_among_others_fails_only_itself(recon, capsys, settled_first):
    recon.add("things", "x")
    found, done = recon.receipt("x"), recon.receipt("done", state=State.SUCCEEDED)
    done_before = [r for r in dump(recon.path)[0] if r[0] == done]
    order = [done, found] if settled_first else [found, done]
    code, out, err = recon.run(capsys, *order)
    assert code == 1
    assert out.startswith(f"{found}  outcome_unknown → succeeded  ") and out.count("\n") == 1
    error = f"Error: receipt {done} is succeeded; succeeded → reconciling is not allowed"
    progress = [f"[{n}/2] {rid} test-api/things.create ..." for n, rid in enumerate(order, 1)]
    assert err.splitlines() == ([progress[0], error, progress[1]] if settled_first else [*progress, error])
    assert recon.store.get(found).state == "succeeded"
    assert [r for r in dump(recon.path)[0] if r[0] == done] == done_before
    assert recon.reads("things") == 1


def test_reconcile_before_the_settle_delay_says_when_to_try_again(recon, capsys):
    recon.add("slow", "other")
    rid = recon.receipt("x", kind="slow")  # outcome_unknown at the fake clock's T0
    read = f"read GET {recon.up.url}{recon.api_path('slow')} → HTTP 200: not found among 1 items"
    code, out, _ = recon.run(capsys, rid)
    assert code == 0
    assert out == (
        f"{rid}  outcome_unknown → outcome_unknown  {read}; this read proves absence only 600s after "
        f"the outcome became unknown: try again after 2026-03-01T12:10:00.000000Z\n"
    )
    assert recon.store.get(rid).state == "outcome_unknown" and recon.reads("slow") == 1
    recon.clock.advance(601)
    code, out, _ = recon.run(capsys, rid)
    assert out == f"{rid}  outcome_unknown → safe_to_retry  {read}; absence is proven and the rule allows a retry\n"
    assert recon.reads("slow") == 2 and recon.up.seen(recon.api_path("slow")) == 1  # reads only: the one seeded item
