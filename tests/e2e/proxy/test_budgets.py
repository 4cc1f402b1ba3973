"""
Effect budgets through real mitmdump processes (store/budgets.py), on SQLite and PostgreSQL:

- a burst of 200 concurrent writes (distinct intents) against a budget of 20: exactly 20 reach the
  upstream, the 180 others get 429 budget_exceeded with a Retry-After, and the 20 receipts hold the
  budget (`receipts budgets --json` says 20 of 20);
- a write that ends rejected gives its share back: the next write is admitted;
- a budget that sums a field refuses, 400 and no receipt, a write without a number there;
- on PostgreSQL, two mitmdump processes sharing the database split a burst and together send exactly 20.

The budget's window is 366 days, so that no window turns during a test (one turn a year, aligned to the
UTC epoch); the window math itself is tested in tests/store/test_budgets.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from proxy_addon.states import State
from proxy_addon.store import open_store
from tests.conftest import ROOT
from tests.e2e.processes import Answer, Clients, Proxy, start_all

pytestmark = pytest.mark.e2e

WINDOW = 366 * 86400
RULES = """
api: budget-test
hosts: [127.0.0.1]
credentials: {header: api-key}
operations:
  burst.create:
    match: {method: POST, path: "/api/{bucket}/burst"}
    fingerprint: {body: [title]}
    budget: {window: 366d, count: %(count)d}
  charges.create:
    match: {method: POST, path: "/api/{bucket}/charges"}
    fingerprint: {body: [title, amount]}
    budget: {per: principal, window: 366d, sum: amount, max: 1000}
"""


def rules(tmp_path: Path, count: int) -> Path:
    path = tmp_path / "budget-rules.yaml"
    path.write_text(RULES % {"count": count})
    return path


def proxy(tmp_path: Path, confdir: Path, db: str, rules_path: Path, name: str = "p") -> Proxy:
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    return Proxy(d, confdir, db=db, rules=rules_path)


def burst(proxies: list[Proxy], url: str, n: int) -> list[Answer]:
    """`n` writes of distinct intents at once, spread over the proxies, each on its own thread."""
    results: list[Answer | None] = [None] * n
    barrier = threading.Barrier(n)

    def send(i: int) -> None:
        try:
            barrier.wait(timeout=60)
        finally:
            results[i] = Clients(proxies[i % len(proxies)]).send(
                "requests", "POST", url, {"title": f"w{i}"}, timeout=120
            )

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a write of the burst never ended"
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def stored(db: str, bucket: str):
    store = open_store(db, create=False)
    try:
        return [(r, store.events(r.operation_id)) for r in store.list(limit=None) if bucket in r.target]
    finally:
        store.close()


def budgets_json(db: str, rules_path: Path) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "proxy_addon.cli", "--db", db, "budgets", "--rules", str(rules_path), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


def check_burst(answers: list[Answer], db: str, bucket: str, upstream, path: str, rules_path: Path) -> None:
    statuses = Counter(a.status for a in answers)
    assert upstream.seen(path) == 20 and upstream.commits(path) == 20
    assert statuses == {201: 20, 429: 180}, statuses
    for a in (a for a in answers if a.status == 429):
        body = a.json()
        assert (body["error"], body["sent"], body["state"]) == ("budget_exceeded", False, "rejected")
        assert 1 <= int(a.headers["retry-after"]) <= WINDOW
        assert int(a.headers["retry-after"]) == body["retry_after_seconds"]
        assert "budget[0]: 20 writes per 366d" in body["detail"] and "20 of 20 used" in body["detail"]
    receipts = stored(db, bucket)
    states = Counter(str(r.state) for r, _ in receipts)
    assert states == {"succeeded": 20, "rejected": 180}, states
    for r, events in receipts:
        if r.state is State.REJECTED:
            assert [e.event for e in events] == ["transition"]  # refused when admitted, nothing else
            assert events[0].reason.startswith("over budget: budget-test burst.create budget[0]")
    [listed] = [b for b in budgets_json(db, rules_path) if b["operation"] == "burst.create"]
    assert (listed["used"], listed["limit"], listed["per"]) == (20, 20, "operation")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_burst_of_200_writes_meets_a_budget_of_20_exactly(backend, request, tmp_path, confdir, upstream, bucket):
    db = request.getfixturevalue("pg_url") if backend == "postgres" else str(tmp_path / "receipts.db")
    rules_path = rules(tmp_path, 20)
    p = proxy(tmp_path, confdir, db, rules_path).start()
    path = f"/api/{bucket}/burst"
    try:
        answers = burst([p], upstream.url + path, 200)
        check_burst(answers, db, bucket, upstream, path, rules_path)
    finally:
        p.stop()


def test_two_proxies_sharing_postgresql_send_exactly_20_of_a_burst(pg_url, tmp_path, confdir, upstream, bucket):
    rules_path = rules(tmp_path, 20)
    key = ("--set", f"receipts_secret={tmp_path / 'fleet-secret.key'}")  # a fleet shares one key
    proxies = [proxy(tmp_path, confdir, pg_url, rules_path, name) for name in ("a", "b")]
    for p in proxies:
        p.extra = key
    start_all(proxies)
    path = f"/api/{bucket}/burst"
    try:
        answers = burst(proxies, upstream.url + path, 200)
        check_burst(answers, pg_url, bucket, upstream, path, rules_path)
        sent_by = Counter(r.instance for r, _ in stored(pg_url, bucket) if r.state is State.SUCCEEDED)
        print(f"two proxies, one budget of 20: upstream saw {upstream.seen(path)}; sent per proxy {dict(sent_by)}")
    finally:
        for p in proxies:
            p.stop()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_write_that_ends_rejected_gives_its_share_back(backend, request, tmp_path, confdir, upstream, bucket):
    db = request.getfixturevalue("pg_url") if backend == "postgres" else str(tmp_path / "receipts.db")
    p = proxy(tmp_path, confdir, db, rules(tmp_path, 2)).start()
    path = f"/api/{bucket}/burst"
    url = upstream.url + path
    try:
        c = Clients(p)
        assert c.send("requests", "POST", url, {"title": "one"}).status == 201
        upstream.plan(path, "400")  # the API refuses the next one before doing anything: rejected
        refused = c.send("requests", "POST", url, {"title": "two"})
        assert refused.status == 400 and refused.headers["x-receipt-state"] == "rejected"
        assert c.send("requests", "POST", url, {"title": "three"}).status == 201  # "two" gave its share back
        over = c.send("requests", "POST", url, {"title": "four"})
        assert over.status == 429 and over.json()["error"] == "budget_exceeded"
        assert upstream.seen(path) == 3 and upstream.commits(path) == 2
        again = c.send("requests", "POST", url, {"title": "one"})  # a duplicate of a success is not charged
        assert again.status == 201 and again.headers.get("x-receipt-replayed") == "true"
        assert upstream.seen(path) == 3
    finally:
        p.stop()


def test_a_summed_budget_refuses_a_write_it_cannot_count_and_sums_per_principal(tmp_path, confdir, upstream, bucket):
    db = str(tmp_path / "receipts.db")
    p = proxy(tmp_path, confdir, db, rules(tmp_path, 20)).start()
    path = f"/api/{bucket}/charges"
    url = upstream.url + path
    try:
        c = Clients(p)
        missing = c.send("curl", "POST", url, {"title": "no amount"})
        assert missing.status == 400 and missing.json()["error"] == "budget_uncountable"
        assert "'amount'" in missing.json()["detail"] and "x-receipt-id" not in missing.headers
        assert c.send("curl", "POST", url, {"title": "a", "amount": 600}).status == 201
        over = c.send("curl", "POST", url, {"title": "b", "amount": 500})  # 600 + 500 > 1000
        assert over.status == 429 and "600 of 1000 used" in over.json()["detail"]
        other = c.send("curl", "POST", url, {"title": "b", "amount": 500}, headers={"api-key": "another-caller"})
        assert other.status == 201  # another principal: a budget of its own
        assert c.send("curl", "POST", url, {"title": "c", "amount": 400}).status == 201  # exactly 1000
        assert upstream.seen(path) == 3
        assert [r for r, _ in stored(db, bucket) if "no amount" in json.dumps(r.intent)] == []
    finally:
        p.stop()
