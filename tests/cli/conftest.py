"""
Fixtures and helpers for the `receipts` CLI tests: databases to read (`db`, `timeline`) and
to write (`review`, `recon`), running the CLI in-process, and reading what it printed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import http.client
import json
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy_addon.cli import main
from proxy_addon.states import State
from proxy_addon.store import Attempt, RecordedResponse, Store
from tests.conftest import T0, FakeClock
from tests.upstream import Upstream

ROOT = Path(__file__).resolve().parents[2]
RECEIPTS = ROOT / ".venv" / "bin" / "receipts"

# "Now" for the CLI when it reads the `db` fixture: five days after it was built.
NOW = T0 + dt.timedelta(days=5)
BODY_MARKER = "RESPONSE-BODY-MARKER-5e1f"
LIST_HEADERS = ["ID", "AGE", "OPERATION", "STATE", "HTTP", "EXTERNAL-ID", "BLOCKED", "REPLAYED", "OBSERVE", "TARGET"]
BLOCKED_HEADERS = ["TIME", "KIND", "RECEIPT", "OPERATION", "STATE", "REASON"]
UNKNOWN_ID = "20260101T000000Z-0000000000"


def attempt(n: int, *, api: str = "dev.to", operation: str = "articles.create", flow_id: str | None = None) -> Attempt:
    return Attempt(
        api=api,
        operation=operation,
        method="POST",
        target=f"https://{api}/api/articles?page={n}",
        intent_fingerprint=f"sha256:{n:064x}",
        intent={"body": {"article.title": f"Post {n}"}},
        principal="anonymous",
        flow_id=flow_id or f"flow-{n}",
    )


def at(**delta) -> str:
    """The store's text for T0 + delta."""
    return (T0 + dt.timedelta(**delta)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.fixture(autouse=True)
def no_default_db(monkeypatch, tmp_path):
    """Never let a test fall back on the user's real database."""
    monkeypatch.delenv("RECEIPT_PROXY_DB", raising=False)
    monkeypatch.delenv("RECEIPT_PROXY_STATE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """
    One succeeded, one outcome_unknown and one submitted receipt (in that order), the first
    with a recorded response replayed once, the second with two blocked duplicates.
    Built once on a FakeClock starting at T0: every test using it only reads it.

        T0        succeeded (HTTP 201, art_1, response recorded)
        T0+1h     a duplicate of it, replayed
        T0+22h    outcome_unknown
        T0+23h    a duplicate of it, blocked (flow-22)
        T0+24h    another, blocked (flow-dup)
        NOW-2h    submitted
    """
    path = tmp_path_factory.mktemp("cli") / "receipts.db"
    clock = FakeClock()
    store = Store.open(path, clock=clock)
    ids = {}
    ok = store.begin_attempt(attempt(1)).receipt.operation_id
    store.transition(
        ok,
        State.SUCCEEDED,
        reason="HTTP 201",
        http_status=201,
        external_id="art_1",
        response=RecordedResponse(
            201, [("content-type", "application/json")], json.dumps({"id": BODY_MARKER}).encode()
        ),
    )
    ids["succeeded"] = ok
    clock.now = T0 + dt.timedelta(hours=1)
    assert store.begin_attempt(attempt(1)).kind == "replay"
    clock.now = T0 + dt.timedelta(hours=22)
    unk = store.begin_attempt(attempt(22)).receipt.operation_id
    store.transition(unk, State.OUTCOME_UNKNOWN, reason="upstream reset", error="server closed connection")
    ids["outcome_unknown"] = unk
    clock.now = T0 + dt.timedelta(hours=23)
    assert store.begin_attempt(attempt(22)).kind == "blocked"
    clock.now = T0 + dt.timedelta(hours=24)
    assert store.begin_attempt(attempt(22, flow_id="flow-dup")).kind == "blocked"
    clock.now = NOW - dt.timedelta(hours=2)
    ids["submitted"] = store.begin_attempt(attempt(3)).receipt.operation_id
    store.close()
    return path, ids


@pytest.fixture(scope="module")
def timeline(tmp_path_factory):
    """Three receipts of three operations, an hour or two apart; read at T0+4h."""
    path = tmp_path_factory.mktemp("timeline") / "receipts.db"
    clock = FakeClock()
    store = Store.open(path, clock=clock)
    ids = {}
    ids["dev.to/articles.create"] = store.begin_attempt(attempt(1)).receipt.operation_id  # T0
    clock.advance(3600)
    ids["dev.to/articles.update"] = store.begin_attempt(attempt(2, operation="articles.update")).receipt.operation_id
    clock.advance(2 * 3600)
    ids["medium.com/articles.create"] = store.begin_attempt(attempt(3, api="medium.com")).receipt.operation_id
    store.close()
    return path, ids


def cli(capsys, *argv: str, now: dt.datetime = NOW) -> tuple[int, str, str]:
    code = main(list(argv), clock=lambda: now)
    out, err = capsys.readouterr()
    return code, out, err


def dump(path: Path) -> tuple[list, list]:
    """Both tables, every column: to show a command wrote nothing."""
    conn = sqlite3.connect(path)
    try:
        return (
            conn.execute("SELECT * FROM receipts ORDER BY operation_id").fetchall(),
            conn.execute("SELECT * FROM receipt_events ORDER BY id").fetchall(),
        )
    finally:
        conn.close()


def assert_one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 1, (out, err)
    assert out == ""
    assert err.startswith("Error: ") and err.endswith("\n") and err.count("\n") == 1, err
    for n in needles:
        assert n in err, (n, err)


def table(out: str, headers: list[str]) -> list[dict[str, str]]:
    """Rows of a table whose cells have no spaces, except the last column's."""
    lines = out.splitlines()
    assert lines[0].split() == headers, out
    return [dict(zip(headers, line.split(None, len(headers) - 1), strict=True)) for line in lines[1:]]


def list_rows(out: str) -> dict[str, dict[str, str]]:
    """Rows of the `list` table, by operation id, in order."""
    return {row["ID"]: row for row in table(out, LIST_HEADERS)}


# Submitted at T0 (12:00Z), T0+1h and T0+3h; now is T0+4h.
SINCE_CASES = [
    pytest.param("5h", ["medium.com/articles.create", "dev.to/articles.update", "dev.to/articles.create"], id="5h"),
    pytest.param("3h", ["medium.com/articles.create", "dev.to/articles.update"], id="3h-includes-the-boundary"),
    pytest.param("90m", ["medium.com/articles.create"], id="90m"),
    pytest.param("30m", [], id="30m"),
    pytest.param("1d", ["medium.com/articles.create", "dev.to/articles.update", "dev.to/articles.create"], id="1d"),
    pytest.param(
        "2026-03-01", ["medium.com/articles.create", "dev.to/articles.update", "dev.to/articles.create"], id="date"
    ),
    pytest.param("2026-03-02", [], id="date-after"),
    pytest.param("2026-03-01T13:00:00Z", ["medium.com/articles.create", "dev.to/articles.update"], id="Z"),
    pytest.param("2026-03-01T13:00:01Z", ["medium.com/articles.create"], id="a-second-later"),
    pytest.param("2026-03-01T14:00:00+01:00", ["medium.com/articles.create", "dev.to/articles.update"], id="offset"),
    pytest.param("2026-03-01T13:00:00", ["medium.com/articles.create", "dev.to/articles.update"], id="naive-is-UTC"),
]


# --- writable databases -------------------------------------------------------------------


@pytest.fixture
def review(tmp_path):
    """A fresh database with a receipt in each state a human might try to resolve; writable."""
    path = tmp_path / "receipts.db"
    clock = FakeClock()
    store = Store.open(path, clock=clock)
    ids = {}
    ids["outcome_unknown"] = store.begin_attempt(attempt(1)).receipt.operation_id
    store.transition(ids["outcome_unknown"], State.OUTCOME_UNKNOWN, reason="upstream reset")
    ids["manual_review"] = store.begin_attempt(attempt(2)).receipt.operation_id
    store.transition(ids["manual_review"], State.OUTCOME_UNKNOWN, reason="upstream reset")
    store.transition(ids["manual_review"], State.MANUAL_REVIEW, reason="reconcile could not tell")
    ids["succeeded"] = store.begin_attempt(attempt(3)).receipt.operation_id
    store.transition(ids["succeeded"], State.SUCCEEDED, reason="HTTP 201", http_status=201)
    ids["submitted"] = store.begin_attempt(attempt(4)).receipt.operation_id
    ids["reconciling"] = store.begin_attempt(attempt(5)).receipt.operation_id
    store.transition(ids["reconciling"], State.OUTCOME_UNKNOWN, reason="upstream reset")
    store.claim_for_reconcile(ids["reconciling"], actor="reconciler")
    ids["rejected"] = store.begin_attempt(attempt(6)).receipt.operation_id
    store.transition(ids["rejected"], State.REJECTED, reason="HTTP 422", http_status=422)
    clock.advance(600)
    yield path, ids, clock, store
    store.close()


@pytest.fixture
def alice(monkeypatch):
    monkeypatch.setenv("LOGNAME", "alice")


# --- reconcile: a rules file and an upstream for the reads -------------------------------

KEY_ENV = "RECEIPTS_TEST_API_KEY"
RECONCILE_RULES = f"""\
api: test-api
hosts: [127.0.0.1]
credentials: {{header: api-key, env: {KEY_ENV}}}
operations:
  things.create:
    description: A complete list, so "not found" proves absence
    match: {{method: POST, path: "/api/{{bucket}}/things"}}
    fingerprint: {{body: [title]}}
    external_id: id
    reconcile:
      read: {{method: GET, url: "/api/{{path.bucket}}/things"}}
      find: {{title: "{{intent.title}}"}}
      absence_provable: true
      retry_when_absent: true
  notes.create:
    description: A list that may be paginated, so "not found" proves nothing
    match: {{method: POST, path: "/api/{{bucket}}/notes"}}
    fingerprint: {{body: [title]}}
    external_id: id
    reconcile:
      read: {{url: "/api/{{path.bucket}}/notes"}}
      find: {{title: "{{intent.title}}"}}
  drafts.create:
    description: A complete list, but a retry needs a human's word
    match: {{method: POST, path: "/api/{{bucket}}/drafts"}}
    fingerprint: {{body: [title]}}
    external_id: id
    reconcile:
      read: {{url: "/api/{{path.bucket}}/drafts"}}
      find: {{title: "{{intent.title}}"}}
      absence_provable: true
  lookups.create:
    description: One item, by its title (a number here); the read's status decides
    match: {{method: POST, path: "/api/{{bucket}}/lookups"}}
    fingerprint: {{body: [title]}}
    external_id: id
    reconcile:
      read: {{url: "/api/{{path.bucket}}/lookups/{{intent.title}}"}}
      absence_provable: true
      retry_when_absent: true
  plain.create:
    description: No reconcile spec
    match: {{method: POST, path: "/api/{{bucket}}/plain"}}
    fingerprint: {{body: [title]}}
    external_id: id
  slow.create:
    description: A search index that lags its writes by up to ten minutes
    match: {{method: POST, path: "/api/{{bucket}}/slow"}}
    fingerprint: {{body: [title]}}
    external_id: id
    reconcile:
      read: {{url: "/api/{{path.bucket}}/slow"}}
      find: {{title: "{{intent.title}}"}}
      absence_provable: true
      settle: 10m
      retry_when_absent: true
"""


@dataclass
class Recon:
    """
    A writable receipts database, a rules file and a real upstream the reads go to. The
    upstream is shared by the module (stopping one takes 50 ms); each test has its own bucket,
    /api/<bucket>/<kind>, and counts only the requests to it.
    """

    path: Path
    rules: Path
    store: Store
    clock: FakeClock
    up: Upstream
    bucket: str

    def api_path(self, kind: str) -> str:
        return f"/api/{self.bucket}/{kind}"

    def attempt(
        self, title: str, *, kind: str = "things", api: str = "test-api", operation: str | None = None
    ) -> Attempt:
        """A POST to <upstream>/api/<bucket>/<kind> with the body {"title": title}."""
        return Attempt(
            api=api,
            operation=operation or f"{kind}.create",
            method="POST",
            target=f"{self.up.url}{self.api_path(kind)}",
            intent_fingerprint=f"sha256:{api}/{kind}/{title}",
            intent={"path": {"bucket": self.bucket}, "body": {"title": title}},
            principal="anonymous",
            flow_id=f"flow-{title}",
        )

    def receipt(
        self,
        title: str,
        *,
        kind: str = "things",
        state: State = State.OUTCOME_UNKNOWN,
        api: str = "test-api",
        operation: str | None = None,
    ) -> str:
        """The receipt of `attempt(...)`, moved to `state`."""
        attempt = self.attempt(title, kind=kind, api=api, operation=operation)
        if state is State.AWAITING_APPROVAL:  # created as one: its operation needs approval
            attempt = dataclasses.replace(attempt, approval=True)
        rid = self.store.begin_attempt(attempt).receipt.operation_id
        steps = {
            State.AWAITING_APPROVAL: [],
            State.SUBMITTED: [],
            State.SUCCEEDED: [State.SUCCEEDED],
            State.REJECTED: [State.REJECTED],
            State.NOT_SENT: [State.NOT_SENT],
            State.OUTCOME_UNKNOWN: [State.OUTCOME_UNKNOWN],
            State.MANUAL_REVIEW: [State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW],
            State.SAFE_TO_RETRY: [State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW, State.SAFE_TO_RETRY],
            State.RECONCILING: [State.OUTCOME_UNKNOWN, State.RECONCILING],
        }[state]
        for s in steps:
            if s is State.RECONCILING:
                self.store.claim_for_reconcile(rid, actor="another-reconciler")
            else:
                self.store.transition(rid, s, reason=f"to {s}")
        assert self.store.get(rid).state == state
        return rid

    def add(self, kind: str, *titles: str) -> None:
        """Create items on the upstream with real POSTs, as if earlier writes had taken effect."""
        for title in titles:  # a connection each: keep-alive would wait on delayed ACKs
            conn = http.client.HTTPConnection("127.0.0.1", self.up.port, timeout=5)
            try:
                conn.request(
                    "POST", self.api_path(kind), json.dumps({"title": title}), {"Content-Type": "application/json"}
                )
                r = conn.getresponse()
                assert (r.status, json.loads(r.read())["id"]) == (201, self.up.commits(self.api_path(kind)))
            finally:
                conn.close()

    def read_of(self, kind: str) -> str:
        return f"read GET {self.up.url}{self.api_path(kind)}"

    def requests(self) -> list[dict]:
        """What reached this test's bucket on the upstream."""
        with self.up.lock:
            return [q for q in self.up.requests if q["path"].startswith(f"/api/{self.bucket}/")]

    def gets(self) -> list[dict]:
        return [q for q in self.requests() if q["method"] in ("GET", "HEAD")]

    def reads(self, kind: str) -> int:
        return self.up.reads(self.api_path(kind))

    def db_bytes(self) -> bytes:
        return b"".join(p.read_bytes() for p in (self.path, Path(f"{self.path}-wal")) if p.exists())

    def run(self, capsys, *argv: str, rules: bool = True) -> tuple[int, str, str]:
        """`receipts reconcile --rules <ours> ARGV`; a later --rules in ARGV wins."""
        pre = ["--rules", str(self.rules)] if rules else []
        return cli(capsys, "--db", str(self.path), "reconcile", *pre, *argv, now=self.clock.now)


@pytest.fixture(scope="module")
def reads_upstream():
    with Upstream() as up:
        yield up


@pytest.fixture
def recon(tmp_path, monkeypatch, alice, reads_upstream):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv("RECEIPT_PROXY_RULES", raising=False)
    rules = tmp_path / "test-api.yaml"
    rules.write_text(RECONCILE_RULES)
    clock = FakeClock()
    store = Store.open(tmp_path / "receipts.db", clock=clock)
    yield Recon(tmp_path / "receipts.db", rules, store, clock, reads_upstream, uuid.uuid4().hex[:12])
    store.close()
