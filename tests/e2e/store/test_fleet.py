"""
A fleet of proxies on one PostgreSQL store, with real mitmdump processes and the session's
throwaway PostgreSQL (tests/pg.py; skipped with one line when there is none).

- fan-out: 3 instances, 60 identical writes spread across them at once, a slow upstream:
  exactly one upstream write, every other client gets the replay (or a 409);
- kill -9 mid-flight: a live instance blocks the duplicate at once, and moves the receipt to
  outcome_unknown within the lease + 5 s, with an event naming the dead instance;
- PostgreSQL stopped: 503 receipt_store_unavailable, sent:false, nothing upstream; started
  again: the next write succeeds through the same proxies;
- a connection lost while the upstream holds the write: the outcome is still recorded;
- LISTEN/NOTIFY wakes a duplicate waiting for another instance's write sooner than the poll;
- a proxy with another HMAC key refuses to join the fleet;
- a proxy stopped (SIGSTOP) after its commit, before its first byte, sends nothing once it wakes
  after its lease expired: whether a read elsewhere proved absence, an operator resolved the
  receipt, or nobody touched it (then it records not_sent itself);
- a takeover read cannot prove absence while the original may still land: the upstream commits
  late, after its proxy was killed; the live proxy retries nothing, and finds the late effect.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from proxy_addon.store import open_store
from tests.conftest import ROOT, deadline, wait_for
from tests.e2e.processes import Clients, Proxy, start_all


@pytest.fixture
def key(tmp_path) -> Path:
    """The fleet's shared HMAC key (every proxy of a fleet must have the same one)."""
    return tmp_path / "fleet-secret.key"


def instance(pg_url: str, tmp_path: Path, confdir: Path, key: Path, *extra: str, name: str = "") -> Proxy:
    d = tmp_path / (name or f"p{len(list(tmp_path.glob('p*')))}")
    d.mkdir(exist_ok=True)
    return Proxy(d, confdir, db=pg_url, extra=("--set", f"receipts_secret={key}", *extra))


def receipts(pg_url: str, bucket: str):
    store = open_store(pg_url, create=False)
    try:
        return [r for r in store.list(limit=None) if bucket in r.target]
    finally:
        store.close()


def events(pg_url: str, operation_id: str):
    store = open_store(pg_url, create=False)
    try:
        return store.events(operation_id)
    finally:
        store.close()


def instance_id(proxy: Proxy) -> str:
    m = re.search(r"\(instance (\S+)\)", proxy.log())
    assert m is not None, "the proxy logged no instance"
    return m.group(1)


def test_fan_out_60_identical_writes_over_3_instances_make_one_upstream_write(
    pg_url, tmp_path, confdir, upstream, bucket, key
):
    proxies = start_all([instance(pg_url, tmp_path, confdir, key) for _ in range(3)])
    path = f"/api/{bucket}/plain"
    upstream.plan(path, "held")  # the first write is held until let_go: every other one arrives meanwhile
    try:
        results: list = [None] * 60
        barrier = threading.Barrier(60)

        def send(i: int) -> None:
            barrier.wait(timeout=20)
            results[i] = Clients(proxies[i % 3]).send(
                "requests", "POST", upstream.url + path, {"title": "fan"}, timeout=40
            )

        threads = [threading.Thread(target=send, args=(i,)) for i in range(60)]
        for t in threads:
            t.start()
        wait_for(lambda: upstream.seen(path) == 1, timeout=20, what="the first write to reach the upstream")
        time.sleep(1.0)  # the others arrive, find the receipt in flight, and wait
        upstream.let_go(path)
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        statuses = [r.status for r in results]
        assert upstream.seen(path) == 1 and upstream.commits(path) == 1
        assert statuses.count(201) >= 1
        assert set(statuses) <= {201, 409}, statuses
        replayed = [r for r in results if r.headers.get("x-receipt-replayed") or r.status == 201]
        ids = {r.headers.get("x-receipt-id") for r in results if r.status in (201, 409)}
        assert len(ids) == 1  # every answer names the one receipt
        [receipt] = receipts(pg_url, bucket)
        assert receipt.state == "succeeded"
        kinds = [e.event for e in events(pg_url, receipt.operation_id)]
        assert kinds.count("replayed") + kinds.count("blocked") == 59
        assert len(replayed) >= 1
        print(
            f"fan-out: 60 writes over 3 instances -> upstream saw {upstream.seen(path)}; answers "
            f"{statuses.count(201)}x201 ({kinds.count('replayed')} replays), {statuses.count(409)}x409"
        )
    finally:
        for p in proxies:
            p.stop()


def test_kill_9_mid_flight_a_live_instance_blocks_and_recovers_within_the_lease(
    pg_url, tmp_path, confdir, upstream, bucket, key
):
    lease = ("--set", "receipts_lease=10", "--set", "receipts_heartbeat=1")
    a, b = start_all(
        [
            instance(pg_url, tmp_path, confdir, key, *lease),
            instance(pg_url, tmp_path, confdir, key, *lease, "--set", "receipts_wait_submitted=0"),
        ]
    )
    path = f"/api/{bucket}/plain"
    upstream.plan(path, "held")
    dead = instance_id(a)
    try:
        t = threading.Thread(
            target=lambda: Clients(a).send("requests", "POST", upstream.url + path, {"title": "kill"}, timeout=20)
        )
        t.start()
        wait_for(lambda: upstream.seen(path) == 1, what="the write to reach the upstream")
        [before] = receipts(pg_url, bucket)
        assert before.state == "submitted" and before.instance == dead
        a.stop(signal.SIGKILL)
        killed = time.monotonic()

        dup = Clients(b).send("curl", "POST", upstream.url + path, {"title": "kill"})
        assert dup.status == 409 and dup.json()["operation_id"] == before.operation_id
        # At once, not after the lease (10 s, 0.2 s on a quiet machine): answered while still submitted.
        assert dup.json()["state"] == "submitted", dup.json()
        assert upstream.seen(path) == 1

        def recovered():
            [r] = receipts(pg_url, bucket)
            return r if r.state == "outcome_unknown" else None

        r = wait_for(recovered, timeout=10 + 5, interval=0.2, what="the live instance to recover the receipt")
        took = time.monotonic() - killed
        last = events(pg_url, r.operation_id)[-1]
        assert (last.from_state, last.to_state) == ("submitted", "outcome_unknown")
        assert dead in last.reason and "lease expired" in last.reason
        assert last.actor == f"proxy {instance_id(b)}"
        upstream.let_go(path)
        t.join(timeout=25)
        again = Clients(b).send("httpx", "POST", upstream.url + path, {"title": "kill"})
        assert again.status == 409  # outcome_unknown: never retried blindly
        assert upstream.seen(path) == 1
        print(
            f"kill -9: duplicate blocked at once (409), receipt outcome_unknown {took:.1f}s after the kill "
            f"(lease 10s), upstream saw {upstream.seen(path)}"
        )
    finally:
        upstream.let_go(path)
        for p in (a, b):
            p.stop()


def test_postgresql_stopped_then_started_fails_closed_and_recovers(
    pg_cluster, pg_url, tmp_path, confdir, upstream, bucket, key
):
    if not pg_cluster.ours:
        pytest.skip("RECEIPTS_TEST_PG names a server the tests cannot stop")
    proxies = start_all([instance(pg_url, tmp_path, confdir, key) for _ in range(2)])
    path = f"/api/{bucket}/plain"
    try:
        assert Clients(proxies[0]).send("requests", "POST", upstream.url + path, {"n": 0}).status == 201
        pg_cluster.stop()
        try:
            for i, p in enumerate(proxies):
                answer = Clients(p).send("requests", "POST", upstream.url + path, {"n": 1 + i})
                assert answer.status == 503, answer
                body = answer.json()
                assert (body["error"], body["sent"]) == ("receipt_store_unavailable", False)
            assert upstream.seen(path) == 1  # nothing reached the upstream
        finally:
            pg_cluster.start_again()
        for i, p in enumerate(proxies):  # the same processes, no restart
            answer = Clients(p).send("httpx", "POST", upstream.url + path, {"n": 10 + i})
            assert answer.status == 201, answer
        assert upstream.seen(path) == 3
        assert sorted(r.state for r in receipts(pg_url, bucket)) == ["succeeded"] * 3
        print(
            "outage: 2 writes during the outage -> 503 receipt_store_unavailable, sent:false, upstream saw 0; "
            "after the restart both proxies forwarded the next write (201)"
        )
    finally:
        for p in proxies:
            p.stop()


def test_a_connection_lost_while_the_upstream_holds_the_write_still_records_its_outcome(
    pg_cluster, pg_url, tmp_path, confdir, upstream, bucket, key
):
    proxy = start_all([instance(pg_url, tmp_path, confdir, key)])[0]
    path = f"/api/{bucket}/plain"
    upstream.plan(path, "held")
    try:
        answers: list = []
        t = threading.Thread(
            target=lambda: answers.append(
                Clients(proxy).send("requests", "POST", upstream.url + path, {"title": "lost"}, timeout=20)
            )
        )
        t.start()
        wait_for(lambda: upstream.seen(path) == 1, what="the write to reach the upstream")
        # Cut every connection of the proxy to the database (as a failover or a network blip would).
        cut = pg_cluster.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'receipt-proxy' AND pid <> pg_backend_pid()"
        )
        assert cut[0][0] >= 1
        upstream.let_go(path)
        t.join(timeout=25)
        assert answers and answers[0].status == 201
        [r] = receipts(pg_url, bucket)
        assert r.state == "succeeded"
        assert upstream.seen(path) == 1
    finally:
        upstream.let_go(path)
        proxy.stop()


def test_listen_notify_wakes_a_duplicate_waiting_on_another_instance(pg_url, tmp_path, confdir, upstream, bucket, key):
    a, b = start_all([instance(pg_url, tmp_path, confdir, key) for _ in range(2)])
    path = f"/api/{bucket}/plain"
    upstream.plan(path, "held")
    try:
        got: dict = {}

        def send(name, proxy):
            got[name] = Clients(proxy).send("requests", "POST", upstream.url + path, {"t": 1}, timeout=30)
            got[f"{name}_at"] = time.monotonic()

        first = threading.Thread(target=send, args=("a", a))
        first.start()
        wait_for(lambda: upstream.seen(path) == 1, what="the write to reach the upstream")
        second = threading.Thread(target=send, args=("b", b))
        second.start()
        time.sleep(1.5)  # the duplicate arrives at b, finds the receipt submitted by a, and waits
        upstream.let_go(path)
        first.join(timeout=20)
        second.join(timeout=20)
        assert got["a"].status == 201 and got["b"].status == 201  # b: the replay
        lag = got["b_at"] - got["a_at"]
        # The poll behind NOTIFY looks every 5 s (gate.REMOTE_POLL): woken by NOTIFY, b answers well before.
        assert lag < 1.5, f"the duplicate on the other instance answered {lag:.2f}s after the original"
        assert upstream.seen(path) == 1
    finally:
        upstream.let_go(path)
        for p in (a, b):
            p.stop()


def test_a_proxy_with_another_key_refuses_to_join_the_fleet(pg_url, tmp_path, confdir, key):
    first = start_all([instance(pg_url, tmp_path, confdir, key)])[0]
    other = None
    try:
        another = tmp_path / "another.key"
        another.write_text(
            "a" * 64 + "\n"
        )  # a key, not the fleet's (a missing one: tests/e2e/proxy/test_secret_key.py)
        other = instance(pg_url, tmp_path, confdir, another)
        other.start(wait=False)
        other.process.wait(timeout=deadline(30))
        assert other.process.returncode != 0
        assert "is not the one the other proxies on" in other.log()
        assert "postgresql://postgres@127.0.0.1" in other.log()
    finally:
        first.stop()
        if other is not None:
            other.stop()


def test_mitmweb_on_postgresql_follows_a_resolution_from_the_cli(pg_url, tmp_path, confdir, upstream, bucket):
    """scripts/run with RECEIPT_PROXY_DB=postgresql://…: the CLI settles a receipt in the shared store; the
    flow in this instance's mitmweb follows within seconds (its marker and comment)."""
    import subprocess
    import sys

    import requests

    from tests.e2e.processes import ScriptsRun
    from tests.e2e.run.test_approval import operator

    path = f"/api/{bucket}/plain"
    # With a password in the URL (the tests' server trusts loopback, so any password does): the proxy uses
    # it, and neither the banner, the log nor mitmweb's Options show it.
    password = "pw-Not-Shown-7f3a"
    db = pg_url.replace("postgresql://postgres@", f"postgresql://postgres:{password}@", 1)
    assert password in db
    run = ScriptsRun(tmp_path, confdir, log=tmp_path / "mitmweb.log", env={"RECEIPT_PROXY_DB": db}).start()
    try:
        assert "receipts in postgresql://postgres@127.0.0.1" in run.log()
        web, base = operator(run.web_url)
        shown = web.get(f"{base}/options", timeout=5).json()["receipts_db"]["value"]
        assert shown.startswith("postgresql://postgres@127.0.0.1") and password not in shown
        upstream.plan(path, "drop")
        first = requests.post(
            upstream.url + path,
            json={"title": "settle me"},
            timeout=30,
            proxies={"http": run.proxy_url, "https": run.proxy_url},
        )
        assert first.status_code == 502
        operation_id = first.headers["x-receipt-id"]
        subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy_addon.cli",
                "--db",
                pg_url,
                "resolve",
                operation_id,
                "--as",
                "succeeded",
                "--note",
                "checked the dashboard",
            ],
            check=True,
            capture_output=True,
            timeout=30,
            cwd=ROOT,
        )

        def flow():
            return next(
                (
                    f
                    for f in web.get(f"{base}/flows", timeout=5).json()
                    if f.get("comment", "").endswith(f"receipt {operation_id}")
                ),
                None,
            )

        settled = wait_for(
            lambda: (f := flow()) and f["comment"].startswith("succeeded · ") and f,
            timeout=10,
            what="the flow's comment to follow the CLI's resolution",
        )
        assert settled["marked"] == "✅"
        assert password not in run.log()
    finally:
        run.stop()


# --- a paused proxy, a late original (issue 24: "Send only with a live lease", "Takeover reads wait") ---

FAST_LEASE = ("--set", "receipts_lease=2", "--set", "receipts_heartbeat=1")


def send_in_background(proxy: Proxy, url: str, body: dict) -> tuple[threading.Thread, list]:
    got: list = []
    t = threading.Thread(target=lambda: got.append(Clients(proxy).send("requests", "POST", url, body, timeout=90)))
    t.start()
    return t, got


def stopped_after_commit(proxy: Proxy) -> None:
    """Wait until `proxy` holds its write after the commit (receipts_debug_pause), then stop it whole: SIGSTOP."""
    wait_for(lambda: "pausing at after_commit" in proxy.log(), timeout=20, what="the commit (after_commit pause)")
    os.kill(proxy.process.pid, signal.SIGSTOP)


def woken(proxy: Proxy) -> None:
    if proxy.proc is not None and proxy.proc.poll() is None:
        os.kill(proxy.proc.pid, signal.SIGCONT)


def only_receipt(pg_url: str, bucket: str):
    [r] = receipts(pg_url, bucket)
    return r


def recovered(pg_url: str, bucket: str, operation_id: str):
    """The receipt once a live instance has taken it over (outcome_unknown), waited for within a bound."""
    store = open_store(pg_url, create=False)
    try:
        return wait_for(
            lambda: (r := store.get(operation_id)).state == "outcome_unknown" and r,
            timeout=20,
            interval=0.1,
            what="a live instance to take the receipt over",
        )
    finally:
        store.close()


def test_a_paused_proxy_does_not_send_after_a_takeover_read_proved_absence_and_retried(
    pg_url, tmp_path, confdir, upstream, bucket, key
):
    """
    A commits the receipt, and is stopped (SIGSTOP) before its first byte: the after_commit pause
    holds the write there, and the signal stops the whole process, heartbeats too. Its lease
    expires; B takes the receipt over. Once A's request could no longer land (its upstream
    timeout, 1 s, plus the margin), a duplicate at B reads "absent", marks it safe_to_retry and
    sends a new attempt. Then A wakes: it must not send. One write upstream.
    """
    a = instance(
        pg_url,
        tmp_path,
        confdir,
        key,
        *FAST_LEASE,
        "--set",
        "receipts_upstream_timeout=1",
        "--set",
        "receipts_debug_pause=after_commit:3",
    )
    b = instance(pg_url, tmp_path, confdir, key, *FAST_LEASE, "--set", "receipts_wait_submitted=0")
    start_all([a, b])
    path, body = f"/api/{bucket}/things", {"title": "paused"}
    t, got = send_in_background(a, upstream.url + path, body)
    try:
        stopped_after_commit(a)
        first = only_receipt(pg_url, bucket)
        assert first.state == "submitted" and first.instance == instance_id(a)
        recovered(pg_url, bucket, first.operation_id)

        def retried():  # 409 while the read cannot prove absence yet; then the retry goes out
            answer = Clients(b).send("curl", "POST", upstream.url + path, body)
            assert answer.status in (201, 409), answer
            return answer if answer.status == 201 else None

        retry = wait_for(retried, timeout=30, interval=0.5, what="B to prove absence and send the retry")
        assert upstream.seen(path) == 1
        assert only_receipt_of(pg_url, first.operation_id).state == "safe_to_retry"
        woken(a)
        t.join(timeout=30)
        assert not t.is_alive() and got
        answer = got[0]
        assert answer.status == 502 and answer.json()["error"] == "not_sent", answer
        assert answer.json()["operation_id"] == first.operation_id
        assert upstream.seen(path) == 1 and upstream.commits(path) == 1  # B's retry only
        assert only_receipt_of(pg_url, first.operation_id).state == "safe_to_retry"  # B's verdict stands
        [retry_receipt] = [r for r in receipts(pg_url, bucket) if r.retry_of == first.operation_id]
        assert retry_receipt.state == "succeeded" and retry.headers["x-receipt-id"] == retry_receipt.operation_id
        assert "nothing was sent" in a.log()
    finally:
        woken(a)
        for p in (a, b):
            p.stop()


def test_a_paused_proxy_does_not_send_after_an_operator_resolved_its_receipt(
    pg_url, tmp_path, confdir, upstream, bucket, key
):
    """
    The same pause, with the default upstream timeout (300 s: the request's lifetime has not
    passed when A wakes): what stops A is its lease alone. Meanwhile B took the receipt over and
    an operator resolved it safe_to_retry (receipts resolve), and B sent the retry.
    """
    a = instance(pg_url, tmp_path, confdir, key, *FAST_LEASE, "--set", "receipts_debug_pause=after_commit:3")
    b = instance(pg_url, tmp_path, confdir, key, *FAST_LEASE, "--set", "receipts_wait_submitted=0")
    start_all([a, b])
    path, body = f"/api/{bucket}/plain", {"title": "resolved"}
    t, got = send_in_background(a, upstream.url + path, body)
    try:
        stopped_after_commit(a)
        first = only_receipt(pg_url, bucket)
        recovered(pg_url, bucket, first.operation_id)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy_addon.cli",
                "--db",
                pg_url,
                "resolve",
                first.operation_id,
                "--as",
                "safe_to_retry",
                "--note",
                "checked the upstream: not there",
            ],
            check=True,
            capture_output=True,
            timeout=30,
            cwd=ROOT,
        )
        assert Clients(b).send("httpx", "POST", upstream.url + path, body).status == 201
        assert upstream.seen(path) == 1
        woken(a)
        t.join(timeout=30)
        assert not t.is_alive() and got
        assert got[0].status == 502 and got[0].json()["error"] == "not_sent", got[0]
        assert upstream.seen(path) == 1
        assert only_receipt_of(pg_url, first.operation_id).state == "safe_to_retry"
        assert "lease" in a.log().split("pausing at after_commit", 1)[1]  # refused for its lease
    finally:
        woken(a)
        for p in (a, b):
            p.stop()


def test_a_proxy_paused_past_its_lease_records_not_sent_when_nobody_took_its_receipt(
    pg_url, tmp_path, confdir, upstream, bucket, key
):
    """Alone in its fleet, A wakes after its lease expired: nothing is sent, the receipt (still its own) says
    not_sent, and the agent's retry goes out."""
    a = start_all(
        [instance(pg_url, tmp_path, confdir, key, *FAST_LEASE, "--set", "receipts_debug_pause=after_commit:3")]
    )[0]
    path, body = f"/api/{bucket}/plain", {"title": "alone"}
    t, got = send_in_background(a, upstream.url + path, body)
    try:
        stopped_after_commit(a)
        time.sleep(3.5)  # longer than the lease (2 s): the pause to test, not a wait for something
        woken(a)
        t.join(timeout=30)
        assert not t.is_alive() and got
        assert got[0].status == 502 and got[0].json()["error"] == "not_sent", got[0]
        r = only_receipt(pg_url, bucket)
        assert r.state == "not_sent" and "lease" in r.error
        assert upstream.seen(path) == 0
        # New writes wait for the heartbeat to take the lease again (until then: 503, nothing sent).
        wait_for(lambda: "taken again" in a.log(), timeout=20, what="the heartbeat to take the lease again")
        retry = Clients(a).send("requests", "POST", upstream.url + path, body, timeout=30)  # pause again: 3 s
        assert retry.status == 201 and upstream.seen(path) == 1
    finally:
        woken(a)
        a.stop()


def test_a_takeover_read_does_not_prove_absence_while_the_original_may_still_land(
    pg_url, tmp_path, confdir, upstream, bucket, key
):
    """
    A sends; the upstream holds the write and commits it only later (commit_late). A is killed
    (SIGKILL). B takes the receipt over once A's lease expires, and a duplicate at B reads: the
    write is not there yet, but A's request could still land until its in_flight_until (A's
    upstream timeout, 6 s, after the commit) plus the margin, so nothing is proven and nothing
    sent. The original then commits. After that time, a read finds it: succeeded, one effect.
    """
    a = instance(pg_url, tmp_path, confdir, key, *FAST_LEASE, "--set", "receipts_upstream_timeout=6")
    b = instance(pg_url, tmp_path, confdir, key, *FAST_LEASE, "--set", "receipts_wait_submitted=0")
    start_all([a, b])
    path, body = f"/api/{bucket}/things", {"title": "late"}
    upstream.plan(path, "commit_late")
    t, _ = send_in_background(a, upstream.url + path, body)
    try:
        wait_for(lambda: upstream.seen(path) == 1, what="the write to reach the upstream")
        a.stop(signal.SIGKILL)
        first = recovered(pg_url, bucket, only_receipt(pg_url, bucket).operation_id)
        lands_by = dt.datetime.fromisoformat(first.submitted_at) + dt.timedelta(seconds=6 + 2)  # timeout + margin
        early = Clients(b).send("curl", "POST", upstream.url + path, body)
        assert dt.datetime.now(dt.UTC) < lands_by, "too slow a machine: B read after the original's lifetime"
        assert early.status == 409 and early.json()["operation_id"] == first.operation_id, early
        assert "may still land" in early.json()["hint"] and int(early.headers["retry-after"]) >= 1
        assert upstream.seen(path) == 1 and upstream.reads(path) == 1  # read, not retried
        assert first.completed_at is None and first.upstream_timeout == 6  # nobody saw it end
        assert dt.datetime.fromisoformat(first.in_flight_until) + dt.timedelta(seconds=2) == lands_by
        now = only_receipt_of(pg_url, first.operation_id)
        assert now.state == "outcome_unknown" and now.next_read_at is not None
        assert dt.datetime.fromisoformat(now.next_read_at) == lands_by
        last = [e for e in events(pg_url, first.operation_id) if e.event == "transition"][-1]
        assert (last.from_state, last.to_state) == ("reconciling", "outcome_unknown")
        assert "the original request may still land until" in last.reason
        upstream.let_go(path)  # the original commits now, late
        wait_for(lambda: upstream.commits(path) == 1, what="the late commit")

        def settled():
            Clients(b).send("curl", "POST", upstream.url + path, body)
            r = only_receipt_of(pg_url, first.operation_id)
            return r if r.state != "outcome_unknown" else None

        done = wait_for(settled, timeout=30, interval=0.5, what="a read after the original's lifetime")
        assert done.state == "succeeded"  # found: the late original
        assert upstream.seen(path) == 1 and upstream.commits(path) == 1
    finally:
        upstream.let_go(path)
        t.join(timeout=30)
        for p in (a, b):
            p.stop()


def only_receipt_of(pg_url: str, operation_id: str):
    store = open_store(pg_url, create=False)
    try:
        return store.get(operation_id)
    finally:
        store.close()
