"""
The PostgreSQL backend's own parts, against the session's real server (the shared contract runs on both
backends in tests/store/test_receipts.py and tests/test_states.py): naming the database without its
password, URLs, conninfo and PG* variables, recorded migrations and a concurrent first start, failing
closed when the server is gone or the write lock is held, reconnecting, leases, and the CLI's every
command. Which values name PostgreSQL at all: tests/store/test_dsn.py.
"""

from __future__ import annotations

import datetime as dt
import json
import threading

import psycopg
import pytest

from proxy_addon.cli import main
from proxy_addon.errors import StoreError, StoreUnavailable
from proxy_addon.gate.leases import recover_expired
from proxy_addon.states import State
from proxy_addon.store import Attempt, PostgresStore, RecordedResponse, open_store
from proxy_addon.store.dsn import describe
from tests.conftest import T0, FakeClock


def attempt(fp: str = "fp-1", instance: str | None = "inst-1") -> Attempt:
    return Attempt(
        api="example",
        operation="articles.create",
        method="POST",
        target="https://api.example/a",
        intent_fingerprint=fp,
        intent={"t": fp},
        principal="agent-1",
        flow_id="f",
        instance=instance,
    )


def test_the_password_is_never_shown(pg_cluster, monkeypatch):
    assert (
        describe("postgresql://proxy:s3cret-PW@db.internal:5433/receipts")
        == "postgresql://proxy@db.internal:5433/receipts"
    )
    assert "s3cret" not in describe("host=db.internal user=proxy password=s3cret-PW dbname=receipts")
    # A wrong password: the error names the database, never the password.
    port = pg_cluster.url.split(":")[2].split("/")[0] if pg_cluster.ours else "5432"
    with pytest.raises(StoreError) as info:
        open_store(f"postgresql://nobody:s3cret-PW@127.0.0.1:{port}/no_such_db", create=False)
    assert "s3cret" not in str(info.value)
    assert "postgresql://nobody@127.0.0.1" in str(info.value)


def test_conninfo_and_pg_variables(pg_cluster, pg_url, monkeypatch):
    if not pg_cluster.ours:
        pytest.skip("needs the tests' own server (its port)")
    open_store(pg_url).close()  # migrated
    schema = pg_url.split("search_path%3D")[1]
    conninfo = f"host=127.0.0.1 port={pg_cluster.port} user=postgres dbname=postgres options=-csearch_path={schema}"
    store = open_store(conninfo, create=False)
    try:
        assert store.location == f"postgresql://postgres@127.0.0.1:{pg_cluster.port}/postgres"
        assert store.counts() == {}
    finally:
        store.close()
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    monkeypatch.setenv("PGPORT", str(pg_cluster.port))
    monkeypatch.setenv("PGUSER", "postgres")
    monkeypatch.setenv("PGDATABASE", "postgres")
    monkeypatch.setenv("PGOPTIONS", f"-csearch_path={schema}")
    store = open_store("postgresql://", create=False)
    try:
        assert store.counts() == {}
    finally:
        store.close()


def test_migrations_recorded_by_name_and_a_concurrent_first_start_migrates_once(pg_cluster):
    url = pg_cluster.new_schema()
    errors: list[str] = []
    barrier = threading.Barrier(6, timeout=15)

    def opener():
        barrier.wait()
        try:
            open_store(url).close()
        except StoreError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=opener) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert errors == []
    store = open_store(url)
    try:
        rows = store._rows("SELECT migration_set, name FROM receipt_proxy_migrations ORDER BY name")
        assert [r["name"] for r in rows] == [
            "m001_receipts",
            "m002_prunable_events_and_idempotency_keys",
            "m003_awaiting_approval_is_unresolved",
            "m004_when_an_idempotency_key_was_first_sent",
            "m005_raw_target",
            "m006_failed_reads",
            "m007_approval_decisions",
            "m008_instance_leases",
            "m009_fingerprint_versions",
            "m010_request_lifetime",
            "m011_key_check_and_sealed_answers",
            "m012_read_principal",
            "m013_interim_answers",
            "m014_approval_links",
            "m015_shadow_receipts",
            "m016_budget_charges",
            "m017_hash_chain",
            "m018_trace_parent",
        ]
        assert {r["migration_set"] for r in rows} == {"receipt-proxy"}
    finally:
        store.close()


def test_open_without_create_refuses_a_database_without_receipts(pg_cluster):
    url = pg_cluster.new_schema()
    with pytest.raises(StoreError, match="is not a receipts database"):
        open_store(url, create=False)


def test_a_lost_connection_fails_closed_then_reconnects(pg_cluster, pg_url):
    store = open_store(pg_url, clock=FakeClock())
    try:
        assert isinstance(store, PostgresStore)
        op = store.begin_attempt(attempt("fp-a")).receipt.operation_id
        assert store.conn is not None
        pid = store.conn.info.backend_pid
        pg_cluster.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(StoreUnavailable, match="cannot write the receipts database postgresql://"):
            store.begin_attempt(attempt("fp-b"))
        # the next call opens a new connection: no restart
        d = store.begin_attempt(attempt("fp-b"))
        assert d.kind == "forward"
        assert store.conn is not None and store.conn.info.backend_pid != pid
        assert store.begin_attempt(attempt("fp-a")).kind == "blocked"
        assert {r.intent_fingerprint for r in store.list()} == {"fp-a", "fp-b"}
        assert store.get(op).state is State.SUBMITTED
    finally:
        store.close()


def test_a_held_write_lock_is_unavailable_within_the_lock_timeout(pg_cluster, pg_url):
    store = PostgresStore.open(pg_url, lock_timeout=0.3)
    blocker = psycopg.connect(pg_url, autocommit=True)
    try:
        blocker.execute("BEGIN")
        blocker.execute("SELECT pg_advisory_xact_lock(%s)", (0x5EC1E7,))
        with pytest.raises(StoreUnavailable, match="lock timeout"):
            store.begin_attempt(attempt())
        blocker.execute("ROLLBACK")
        assert store.counts() == {}
        assert store.begin_attempt(attempt()).kind == "forward"
    finally:
        blocker.close()
        store.close()


def test_expired_leases_are_recovered_with_an_event_naming_the_instance(pg_url):
    store = PostgresStore.open(pg_url)
    other = PostgresStore.open(pg_url)
    try:
        store.claim_lease("live-1", "host-a", 1, 30)
        other.claim_lease("dead-1", "host-b", 2, 30)
        mine = store.begin_attempt(attempt("fp-live", instance="live-1")).receipt.operation_id
        theirs = other.begin_attempt(attempt("fp-dead", instance="dead-1")).receipt.operation_id
        assert recover_expired(store, "live-1") == []  # both alive
        store._execute(
            "UPDATE receipt_instances SET expires_at = now() - interval '1 second' WHERE instance = 'dead-1'"
        )
        assert recover_expired(store, "live-1") == [(theirs, "outcome_unknown")]
        ev = store.events(theirs)[-1]
        assert (ev.from_state, ev.to_state, ev.actor) == (State.SUBMITTED, State.OUTCOME_UNKNOWN, "proxy live-1")
        assert "proxy instance dead-1 on host-b (pid 2) stopped: its lease expired" in ev.reason
        assert store.get(mine).state is State.SUBMITTED
        # the expired instance itself may not record new attempts until its heartbeat takes the lease again
        with pytest.raises(StoreUnavailable, match=r"lease .* has expired"):
            other.begin_attempt(attempt("fp-new", instance="dead-1"))
        assert other.renew_lease("dead-1", "host-b", 2, 30) is False
        assert other.begin_attempt(attempt("fp-new", instance="dead-1")).kind == "forward"
    finally:
        store.close()
        other.close()


def cli(capsys, *argv, now=None):
    code = main(list(argv), clock=lambda: now) if now else main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_cli_command_works_on_postgresql(pg_url, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RECEIPT_PROXY_STATE_DIR", str(tmp_path / "state"))
    clock = FakeClock()
    store = open_store(pg_url, clock=clock)
    ok = store.begin_attempt(attempt("fp-ok")).receipt.operation_id
    store.transition(
        ok, State.SUCCEEDED, reason="HTTP 201", http_status=201, response=RecordedResponse(201, [], b'{"id": 1}')
    )
    store.begin_attempt(attempt("fp-ok"))  # replayed
    unknown = store.begin_attempt(attempt("fp-unknown")).receipt.operation_id
    store.transition(unknown, State.OUTCOME_UNKNOWN, reason="timeout")
    store.begin_attempt(attempt("fp-unknown"))  # blocked
    store.close()
    now = T0 + dt.timedelta(days=40)

    code, out, _ = cli(capsys, "--db", pg_url, "list", "--json")
    assert code == 0 and {r["operation_id"] for r in json.loads(out)} == {ok, unknown}
    monkeypatch.setenv("RECEIPT_PROXY_DB", pg_url)  # the variable, as the proxy's fleet would set it
    code, out, _ = cli(capsys, "show", ok)
    assert code == 0 and ok in out and "succeeded" in out
    code, out, _ = cli(capsys, "blocked")
    assert code == 0 and "replay" in out and "blocked" in out
    code, out, _ = cli(capsys, "export")
    assert code == 0 and {json.loads(line)["operation_id"] for line in out.splitlines()} == {ok, unknown}
    code, out, err = cli(
        capsys,
        "resolve",
        unknown,
        "--as",
        "succeeded",
        "--note",
        "seen in the dashboard",
        now=T0 + dt.timedelta(hours=1),
    )
    assert code == 0, err
    code, out, _ = cli(capsys, "prune", "--older-than", "30d", now=now)
    assert (code, out) == (0, "deleted 2 resolved receipts last changed more than 30d ago\n")
    code, out, _ = cli(capsys, "list")
    assert code == 0 and "no receipts in postgresql://postgres@127.0.0.1" in out
    code, out, err = cli(capsys, "--db", pg_url.replace("postgres@", "postgres:pw-s3cret@"), "list")
    assert "s3cret" not in out + err
