"""
A global bound on reconcile reads (issue 17, item 8), through a real mitmdump: with 40 unknown outcomes
whose duplicates all arrive at once while the upstream holds every read, the proxy runs at most
`receipts_reads_max` reads at once; the others wait their turn, at most `receipts_read_timeout` each,
and no other request waits at all. The upstream counts the reads of a path in progress at once
(`Upstream.reads_at_once`), and the writes. The gate alone: tests/reconcile/test_read_slots.py.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from proxy_addon.store import Receipt, Store
from tests.conftest import wait_for
from tests.e2e.processes import Clients, Proxy
from tests.e2e.proxy.test_startup import run_until_exit
from tests.upstream import Upstream


@pytest.fixture(scope="module")
def held_upstream() -> Iterator[Upstream]:
    """An upstream of this module's own: its held reads wait up to 30 s for let_go (the shared one: 8 s)."""
    with Upstream(hang_seconds=30) as up:
        yield up


READS_MAX, UNKNOWN = 4, 40


def receipts_in(proxy: Proxy, bucket: str) -> list[Receipt]:
    store = Store.open(proxy.db, create=False)
    try:
        return [r for r in store.list(limit=None) if bucket in r.target]
    finally:
        store.close()


@pytest.mark.parametrize("stop", [False, True], ids=["let-go", "sigterm-then-let-go"])
def test_forty_hanging_reads_run_at_most_reads_max_at_once_and_harm_nothing_else(
    tmp_path, confdir, held_upstream, bucket, stop
):
    up = held_upstream
    proxy = Proxy(tmp_path, confdir, extra=("--set", f"receipts_reads_max={READS_MAX}")).start()
    try:
        clients = Clients(proxy)
        path = f"/api/{bucket}/things"
        up.plan(path, *["drop"] * UNKNOWN)
        for i in range(UNKNOWN):  # 40 different writes, each committed and then dropped
            assert clients.send("requests", "POST", up.url + path, {"title": f"w{i}"}).status == 502
        assert up.seen(path) == UNKNOWN
        assert [r.state for r in receipts_in(proxy, bucket)] == ["outcome_unknown"] * UNKNOWN

        up.plan_read(path, *["held"] * UNKNOWN)
        answers: list = [None] * UNKNOWN

        def duplicate(i: int) -> None:
            answers[i] = clients.send("httpx", "POST", up.url + path, {"title": f"w{i}"}, timeout=60)

        threads = [threading.Thread(target=duplicate, args=(i,)) for i in range(UNKNOWN)]
        for t in threads:
            t.start()
        wait_for(lambda: up.reads_at_once(path)[0] >= READS_MAX, timeout=20, what=f"{READS_MAX} held reads")
        time.sleep(0.5)  # room for more reads to start, were there no bound
        assert up.reads_at_once(path) == (READS_MAX, READS_MAX), "(reads held now, the most at once)"
        wait_for(
            lambda: proxy.log().count("its read waits for one to end") >= UNKNOWN - READS_MAX,
            timeout=20,
            what="the other duplicates to wait for a read slot",
        )
        assert up.reads(path) == READS_MAX
        assert collections.Counter(r.state for r in receipts_in(proxy, bucket)) == {
            "reconciling": READS_MAX,
            "outcome_unknown": UNKNOWN - READS_MAX,
        }

        # Unrelated traffic meanwhile: a read that passes through, and another write, answered at once.
        started = time.monotonic()
        other_read = clients.send("curl", "GET", f"{up.url}/api/{bucket}/elsewhere", timeout=10)
        read_took = time.monotonic() - started
        started = time.monotonic()
        other_write = clients.send("requests", "POST", f"{up.url}/api/{bucket}/plain", {"title": "unrelated"})
        write_took = time.monotonic() - started
        assert (other_read.status, other_write.status) == (200, 201)
        # Not behind the held reads (the upstream holds them 8 s): 0.1 s each on a quiet machine.
        assert read_took < 4.0 and write_took < 4.0, (read_took, write_took)
        print(
            f"\n{UNKNOWN} duplicates, their reads held: {up.reads_at_once(path)[1]} reads at once "
            f"(receipts_reads_max={READS_MAX}); an unrelated GET took {read_took * 1000:.0f} ms, "
            f"an unrelated write {write_took * 1000:.0f} ms"
        )
        assert "x-receipt-id" not in other_read.headers and other_write.headers["x-receipt-id"]

        if stop:  # the graceful stop waits for the reads running and those waiting for a slot
            os.kill(proxy.process.pid, signal.SIGTERM)
            wait_for(lambda: "stopping; waiting up to" in proxy.log(), what="the drain to start")
            time.sleep(0.5)
            assert proxy.process.poll() is None
        up.let_go(path)
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        if stop:
            assert proxy.process.wait(timeout=30) == 0
            assert "every matched request in flight has its outcome; exiting" in proxy.log()

        assert [(a.status, a.json()["error"]) for a in answers] == [(409, "duplicate_succeeded")] * UNKNOWN
        settled = receipts_in(proxy, bucket)
        assert collections.Counter(r.state for r in settled) == {"succeeded": UNKNOWN + 1}  # and the unrelated write
        assert up.reads_at_once(path) == (0, READS_MAX)
        assert up.reads(path) == UNKNOWN
        assert up.seen(path) == UNKNOWN  # not one extra write
    finally:
        up.let_go(f"/api/{bucket}/things")
        proxy.stop()


def test_receipts_reads_max_must_be_positive(tmp_path, confdir):
    code, out = run_until_exit(Proxy(tmp_path, confdir, extra=("--set", "receipts_reads_max=0")))
    assert code != 0
    assert "receipts_reads_max must be a positive number, not 0" in out
