"""
Crashes and an unwritable store, with real processes.

SIGKILL at three points (after the receipt commit; while the upstream holds the request;
after the upstream answered but before the receipt was updated), then a restart on the
same DB: no receipt lost, none left submitted, the ambiguous ones outcome_unknown, a
duplicate blocked, and never a second write upstream. Then a full disk (a small tmpfs)
and read-only database files (chattr +i), both needing root and skipped otherwise: a
matched request is not forwarded, and the agent is told why. A DB locked by another
process is in test_integration.py (test_locked_store_answers_503_and_does_not_forward).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from proxy_addon.store import Store
from tests.conftest import wait_for
from tests.e2e.processes import Answer, Clients, Proxy


def receipts(db: Path | str, bucket: str):
    store = Store.open(db, create=False)
    try:
        return [r for r in store.list(limit=None) if bucket in r.target], store.counts()
    finally:
        store.close()


@pytest.mark.parametrize(
    "point, extra, fault, commits",
    [
        ("after_commit", ("--set", "receipts_debug_pause=after_commit:30"), None, 0),
        ("upstream_holds", (), "hang", 1),
        ("after_answer", ("--set", "receipts_debug_pause=after_answer:30"), None, 1),
    ],
    ids=["after-the-receipt-commit", "while-the-upstream-holds-the-write", "after-the-answer-before-the-update"],
)
def test_sigkill_then_restart(point, extra, fault, commits, tmp_path, confdir, upstream, bucket):
    proxy = Proxy(tmp_path, confdir, extra=extra).start()
    path = f"/api/{bucket}/plain"
    if fault:
        upstream.plan(path, fault)
    answers: list[Answer] = []
    t = threading.Thread(
        target=lambda: answers.append(
            Clients(proxy).send("requests", "POST", upstream.url + path, {"title": point}, timeout=20)
        )
    )
    t.start()
    if point == "upstream_holds":
        wait_for(lambda: upstream.seen(path) == 1, what="the upstream to hold the write")
    else:
        wait_for(lambda: f"pausing at {point}" in proxy.log(), what=f"the proxy to pause at {point}")
    before, _ = receipts(proxy.db, bucket)
    assert [r.state for r in before] == ["submitted"]
    proxy.stop(signal.SIGKILL)
    t.join(timeout=25)
    assert answers and answers[0].status is None  # the agent saw its connection die

    restarted = Proxy(tmp_path, confdir, db=proxy.db).start()
    try:
        after, counts = receipts(restarted.db, bucket)
        assert [r.operation_id for r in after] == [before[0].operation_id]  # nothing lost
        assert counts.get("submitted", 0) == 0
        assert after[0].state == "outcome_unknown"
        assert after[0].error == "proxy stopped while the request was in flight"
        dup = Clients(restarted).send("curl", "POST", upstream.url + path, {"title": point})
        assert (dup.status, dup.json()["operation_id"]) == (409, before[0].operation_id)
        assert upstream.commits(path) == commits
        assert upstream.seen(path) == commits  # never a second write
    finally:
        restarted.stop()


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MB tmpfs for the receipts DB, so the test can fill it or make it read-only."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mnt)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def assert_not_forwarded(answer: Answer, upstream, path: str, seen_before: int, proxy: Proxy) -> None:
    assert answer.status == 503
    body = answer.json()
    assert (body["error"], body["sent"]) == ("receipt_store_unavailable", False)
    assert "not sent" in body["hint"]
    assert upstream.seen(path) == seen_before
    assert "NOT forwarded, no receipt could be written" in proxy.log()


def test_full_disk_and_read_only_filesystem(small_fs, tmp_path, confdir, upstream, bucket):
    proxy = Proxy(tmp_path, confdir, db=small_fs / "receipts.db").start()
    clients = Clients(proxy)
    path = f"/api/{bucket}/plain"
    filler = small_fs / "filler"
    try:
        assert clients.send("requests", "POST", upstream.url + path, {"title": "fits"}).status == 201

        with open(filler, "wb") as f, contextlib.suppress(OSError):  # fill the disk to the last byte
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        with contextlib.suppress(OSError), open(filler, "ab") as f:
            while True:
                f.write(b"\0")
                f.flush()
        seen = upstream.seen(path)
        full = clients.send("requests", "POST", upstream.url + path, {"title": "disk full"})
        assert_not_forwarded(full, upstream, path, seen, proxy)
        assert "full" in full.json()["detail"]

        filler.unlink()
        assert clients.send("requests", "POST", upstream.url + path, {"title": "space again"}).status == 201
    finally:
        proxy.stop()


def test_read_only_database_files(tmp_path, confdir, upstream, bucket):
    """The DB and its WAL made immutable (chattr +i: even root cannot write them) while the proxy runs."""
    proxy = Proxy(tmp_path, confdir).start()
    clients = Clients(proxy)
    path = f"/api/{bucket}/plain"
    files = [proxy.db, Path(f"{proxy.db}-wal")]
    try:
        assert clients.send("requests", "POST", upstream.url + path, {"title": "writable"}).status == 201
        if subprocess.run(["chattr", "+i", *map(str, files)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i needs root and a filesystem with attributes (ext4)")
        seen = upstream.seen(path)
        ro = clients.send("httpx", "POST", upstream.url + path, {"title": "read-only"})
        assert_not_forwarded(ro, upstream, path, seen, proxy)
    finally:
        subprocess.run(["chattr", "-i", *map(str, files)], capture_output=True)
        proxy.stop()
    assert "read-only" not in {r.intent["body"]["title"] for r in receipts(proxy.db, bucket)[0]}


@pytest.mark.parametrize(
    "point, extra, fault, commits",
    [
        ("after_commit", ("--set", "receipts_debug_pause=after_commit:30"), None, 0),
        ("upstream_holds", (), "hang", 1),
        ("after_answer", ("--set", "receipts_debug_pause=after_answer:30"), None, 1),
    ],
    ids=["after-the-receipt-commit", "while-the-upstream-holds-the-write", "after-the-answer-before-the-update"],
)
def test_sigkill_then_restart_on_postgresql(point, extra, fault, commits, pg_url, tmp_path, confdir, upstream, bucket):
    """The same three kills on a PostgreSQL store: the restarted proxy recovers the receipt once the
    killed instance's lease (2 s here) has expired, naming it; a duplicate is blocked; one write at most."""
    from proxy_addon.store import open_store

    def pg_receipts():
        store = open_store(pg_url, create=False)
        try:
            return [r for r in store.list(limit=None) if bucket in r.target]
        finally:
            store.close()

    lease = ("--set", "receipts_lease=2", "--set", "receipts_heartbeat=1", "--set", f"receipts_secret={tmp_path}/k")
    proxy = Proxy(tmp_path, confdir, db=pg_url, extra=(*extra, *lease)).start()
    path = f"/api/{bucket}/plain"
    if fault:
        upstream.plan(path, fault)
    t = threading.Thread(
        target=lambda: Clients(proxy).send("requests", "POST", upstream.url + path, {"title": point}, timeout=20)
    )
    t.start()
    if point == "upstream_holds":
        wait_for(lambda: upstream.seen(path) == 1, what="the upstream to hold the write")
    else:
        wait_for(lambda: f"pausing at {point}" in proxy.log(), what=f"the proxy to pause at {point}")
    [before] = pg_receipts()
    assert before.state == "submitted"
    proxy.stop(signal.SIGKILL)
    t.join(timeout=25)

    restarted = Proxy(tmp_path, confdir, db=pg_url, extra=lease).start()
    try:
        after = wait_for(
            lambda: [r for r in pg_receipts() if r.state != "submitted"],
            timeout=2 + 5,
            interval=0.2,
            what="the receipt to be recovered",
        )
        assert [r.operation_id for r in after] == [before.operation_id]  # nothing lost
        assert after[0].state == "outcome_unknown"
        assert before.instance in after[0].error and "lease expired" in after[0].error
        dup = Clients(restarted).send("curl", "POST", upstream.url + path, {"title": point})
        assert (dup.status, dup.json()["operation_id"]) == (409, before.operation_id)
        assert upstream.commits(path) == commits
        assert upstream.seen(path) == commits  # never a second write
    finally:
        restarted.stop()
