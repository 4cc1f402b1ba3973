"""
Pagination is part of a read, through a real mitmdump and a real upstream whose list reads
answer in pages (tests/upstream.py: `?limit=2&starting_after=<id>` with Stripe's `has_more`,
newest first; `?per_page=2&page=k` with a `Link: rel="next"` header). The write the tests look
for is the oldest, so it is on the last page. The upstream counts the reads and the writes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from proxy_addon.store import Store
from tests.conftest import ROOT, SECRETS, wait_for
from tests.e2e.processes import Clients, Proxy

RULES = """\
api: paged
hosts: [127.0.0.1]
credentials: {header: api-key}
operations:
  things.create:
    description: Stripe's pages (has_more, starting_after the last id), at most 5
    match: {method: POST, path: "/api/{bucket}/things"}
    fingerprint: {body: [title]}
    external_id: id
    reconcile:
      read: {method: GET, url: "/api/{path.bucket}/things?limit=2"}
      find: {title: "{intent.title}"}
      items: data
      absence_provable: true
      retry_when_absent: true
      pages: {next: {more: has_more, from: data.-1.id, param: starting_after}, max: 5}
  linked.create:
    description: GitHub's pages (Link rel=next)
    match: {method: POST, path: "/api/{bucket}/linked"}
    fingerprint: {body: [title]}
    external_id: id
    reconcile:
      read: {method: GET, url: "/api/{path.bucket}/linked?per_page=2"}
      find: {title: "{intent.title}"}
      absence_provable: true
      retry_when_absent: true
      pages: {next: link}
  short.create:
    description: Stripe's pages, but at most 2 of them
    match: {method: POST, path: "/api/{bucket}/short"}
    fingerprint: {body: [title]}
    external_id: id
    reconcile:
      read: {method: GET, url: "/api/{path.bucket}/short?limit=2"}
      find: {title: "{intent.title}"}
      items: data
      absence_provable: true
      retry_when_absent: true
      pages: {next: {more: has_more, from: data.-1.id, param: starting_after}, max: 2}
  nopages.create:
    description: A paged list read that declares no pages (what rules check refuses)
    match: {method: POST, path: "/api/{bucket}/nopages"}
    fingerprint: {body: [title]}
    external_id: id
    reconcile:
      read: {method: GET, url: "/api/{path.bucket}/nopages?limit=2"}
      find: {title: "{intent.title}"}
      items: data
      absence_provable: true
      retry_when_absent: true
"""


@pytest.fixture(scope="module")
def paged_proxy(tmp_path_factory, confdir):
    rules = tmp_path_factory.mktemp("paged-rules") / "paged.yaml"
    rules.write_text(RULES)
    p = Proxy(tmp_path_factory.mktemp("paged-proxy"), confdir, rules=rules)
    p.start()
    yield p
    p.stop()


def seed(upstream, path: str, n: int) -> None:
    """`n` other objects, made straight at the upstream (not through the proxy), after the write."""
    for i in range(n):
        req = urllib.request.Request(
            f"{upstream.url}{path}",
            data=json.dumps({"title": f"other-{i}"}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 201


def made(upstream, path: str, title: str) -> int:
    """How many objects with this title the upstream holds: the writes that took effect."""
    return sum(1 for i in upstream.items.get(path, []) if i.get("title") == title)


def receipt_of(proxy: Proxy, path: str, title: str):
    store = Store.open(proxy.db, create=False)
    try:
        (r,) = [x for x in store.list(limit=None) if path in x.target and x.intent["body"] == {"title": title}]
        return r, [e.reason for e in store.events(r.operation_id)]
    finally:
        store.close()


def unknown(paged_proxy, upstream, path: str, title: str, fault: str, others: int):
    """A write the upstream breaks with `fault` (drop: it took effect), then `others` newer objects."""
    upstream.plan(path, fault)
    first = Clients(paged_proxy).send("requests", "POST", upstream.url + path, {"title": title})
    assert first.status == 502
    wait_for(lambda: receipt_of(paged_proxy, path, title)[0].state == "outcome_unknown", what="outcome_unknown")
    seed(upstream, path, others)


@pytest.mark.parametrize("kind", ["things", "linked"])
def test_the_write_on_page_3_is_found(paged_proxy, upstream, bucket, kind):
    path = f"/api/{bucket}/{kind}"
    unknown(paged_proxy, upstream, path, "mine", "drop", 5)  # 6 objects: pages of 2, the write on page 3
    dup = Clients(paged_proxy).send("httpx", "POST", upstream.url + path, {"title": "mine"})
    assert dup.status == 409 and dup.json()["error"] == "duplicate_succeeded"
    assert dup.json()["external_id"] == "1"
    r, history = receipt_of(paged_proxy, path, "mine")
    assert (r.state, r.external_id) == ("succeeded", "1")
    assert upstream.reads(path) == 3  # three pages read, one GET each
    assert made(upstream, path, "mine") == 1  # no second write
    assert any("(page 3)" in h and "found among" in h for h in history)
    gets = [q["path"] for q in upstream.requests if q["method"] == "GET" and q["path"].startswith(path)]
    if kind == "things":
        assert gets == [f"{path}?limit=2", f"{path}?limit=2&starting_after=5", f"{path}?limit=2&starting_after=3"]
    else:
        assert gets == [f"{path}?per_page=2", f"{path}?per_page=2&page=2", f"{path}?per_page=2&page=3"]


def test_absent_after_every_page_is_safe_to_retry(paged_proxy, upstream, bucket):
    path = f"/api/{bucket}/things"
    unknown(paged_proxy, upstream, path, "lost", "lost", 5)  # never took effect; 5 others, 3 pages
    dup = Clients(paged_proxy).send("curl", "POST", upstream.url + path, {"title": "lost"})
    assert dup.status == 201  # absence proven on every page: the retry is sent
    assert upstream.reads(path) == 3
    assert made(upstream, path, "lost") == 1


def test_a_full_page_with_more_and_no_declared_pages_proves_nothing(paged_proxy, upstream, bucket):
    """The Stripe >100 payment intents bug: the write is past the first page, which says has_more."""
    path = f"/api/{bucket}/nopages"
    unknown(paged_proxy, upstream, path, "mine", "drop", 3)  # the write on page 2
    dup = Clients(paged_proxy).send("requests", "POST", upstream.url + path, {"title": "mine"})
    assert dup.status == 409 and dup.json()["error"] == "duplicate_unresolved"
    assert made(upstream, path, "mine") == 1  # no second write
    assert upstream.reads(path) == 1
    r, history = receipt_of(paged_proxy, path, "mine")
    assert r.state == "outcome_unknown" and r.failed_reads == 1 and r.next_read_at
    assert any("has_more: true" in h and "declares no pages" in h and "nothing is proven" in h for h in history)
    again = Clients(paged_proxy).send("httpx", "POST", upstream.url + path, {"title": "mine"})
    assert again.status == 409 and made(upstream, path, "mine") == 1


def test_a_walk_cut_by_max_proves_nothing(paged_proxy, upstream, bucket):
    path = f"/api/{bucket}/short"
    unknown(paged_proxy, upstream, path, "mine", "drop", 5)  # the write on page 3; max: 2
    dup = Clients(paged_proxy).send("requests", "POST", upstream.url + path, {"title": "mine"})
    assert dup.status == 409 and dup.json()["error"] == "duplicate_unresolved"
    assert upstream.reads(path) == 2
    assert made(upstream, path, "mine") == 1  # no second write
    r, history = receipt_of(paged_proxy, path, "mine")
    assert r.state == "outcome_unknown" and r.failed_reads == 1
    assert any("past pages.max (2 pages)" in h for h in history)


def test_receipts_reconcile_walks_the_same_pages(paged_proxy, upstream, bucket):
    """The CLI reads through the same reconcile path: the write on page 3 is found."""
    path = f"/api/{bucket}/things"
    unknown(paged_proxy, upstream, path, "cli", "drop", 5)
    r, _ = receipt_of(paged_proxy, path, "cli")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy_addon.cli",
            "--db",
            str(paged_proxy.db),
            "reconcile",
            r.operation_id,
            "--rules",
            str(paged_proxy.rules),
            "--header",
            f"api-key: {SECRETS['api-key']}",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    (result,) = json.loads(out.stdout)
    assert (result["operation_id"], result["state"]) == (r.operation_id, "succeeded")
    assert upstream.reads(path) == 3
    assert made(upstream, path, "cli") == 1
