"""
Fixtures for integration tests: a real mitmdump process with the addon, in front of a
real upstream (tests/upstream.py) on 127.0.0.1, driven by real clients.

Deadlines
---------
Every wait of the suite is a deadline that scales with the machine's load, in one place:
`deadline(seconds)` is `seconds` times `timeout_scale()`, which is the load average of the
last minute per CPU (os.getloadavg()[0] / os.cpu_count()), at least 1 and at most 10, read
afresh at each call; RECEIPTS_TEST_TIMEOUT_SCALE=<factor> sets it instead (e.g. 5 under a
debugger or on a slow CI runner). `wait_for` scales its timeout by itself, and the process
helpers (tests/e2e/processes.py) wait for a process's own "ready" line with a scaled deadline,
fail at once (with the log's tail) if it died, and stop it by PID if it never got ready.
A deadline bounds a wait, never a speed: a wall-clock assert keeps a margin of 10x or more
over what it measures on a quiet machine, or compares with something it measures alongside.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import pytest

from tests import pg
from tests.upstream import MINTED_KEY, MINTED_TOKEN, Upstream

if TYPE_CHECKING:
    from tests.e2e.processes import Proxy

ROOT = Path(__file__).resolve().parent.parent
TEST_RULES = ROOT / "tests" / "rules_it"

# Marker secrets: every integration request carries them (but the minted ones, which an answer
# carries); none may reach the DB.
# x_thing and blob are names on no list of secret names: a query parameter every Clients request
# carries, and a body key (nested.blob) that tests/e2e/proxy/test_intent_secrets.py sends; redacted all the same.
# path_token and path_room: tokens in a request's path (tests/e2e/proxy/test_other_callers.py), REDACTED and hashed.
SECRETS = {
    "authorization": "Bearer SECRET-AUTH-7f3a9c",
    "cookie": "session=SECRET-COOKIE-51d2e8",
    "api-key": "SECRET-APIKEY-c0ffee",
    "token": "SECRET-QUERY-b16b00b5",
    "x_thing": "SECRET-XTHING-5eed1e",
    "blob": "SECRET-BLOB-0b1e55",
    # path credentials tests/e2e/proxy/test_other_callers.py sends: a Telegram bot token's shape, and a declared one
    "path_token": "555555555:SECRET-PATH-TOKEN-9d2c41_abcdefghijklmnop",
    "path_room": "SECRET-PATH-ROOM-4e7f10",
    # minted by the upstream in its answer to a write (its "mint" fault): the recorded answer is sealed
    "minted_key": MINTED_KEY,
    "minted_token": MINTED_TOKEN,
}


MAX_TIMEOUT_SCALE = 10.0


def timeout_scale() -> float:
    """How much slower than a quiet machine this one is now ("Deadlines" above): 1 to 10, or the override."""
    override = os.environ.get("RECEIPTS_TEST_TIMEOUT_SCALE")
    if override:
        try:
            return max(float(override), 1.0)
        except ValueError:
            raise ValueError(f"RECEIPTS_TEST_TIMEOUT_SCALE={override!r} is not a number") from None
    try:
        per_cpu = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this system
        return 1.0
    return min(max(per_cpu, 1.0), MAX_TIMEOUT_SCALE)


def deadline(seconds: float) -> float:
    """A wait of `seconds` on a quiet machine, scaled to this one's load ("Deadlines" above)."""
    return seconds * timeout_scale()


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    """Poll `predicate` until it returns something truthy, at most `timeout` seconds on a quiet machine (scaled)."""
    timeout = deadline(timeout)
    until = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > until:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def at_once(*calls):
    """Run the calls in threads released together by a barrier; return their results in order."""
    import threading

    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(i, call):
        barrier.wait(timeout=10)
        results[i] = call()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a concurrent call did not finish"
    return results


T0 = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


class FakeClock:
    """A clock the tests move by hand: Store.open(path, clock=FakeClock())."""

    def __init__(self, start: dt.datetime = T0):
        self.now = start

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> dt.datetime:
        self.now += dt.timedelta(seconds=seconds)
        return self.now


TEST_ANSWER_KEY = b"answer-seal-key-of-the-in-process-tests-0123456789abcdef0123456789"


@pytest.fixture(scope="session", autouse=True)
def stores_seal_answers():
    """
    Every store a test opens in this process seals recorded answers with a test key, as the
    proxy's Installation sets one from secret.key (a store without one records no answer:
    tests/store/test_sealing.py). Proxies in their own process (Proxy, ScriptsRun) use their
    real secret.key.
    """
    from proxy_addon.store.sealing import AnswerSeal
    from proxy_addon.store.transitions import ReceiptTransitions

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ReceiptTransitions, "answer_seal", AnswerSeal(TEST_ANSWER_KEY))
        yield


def recorded_answer(db: Path | str, receipt):
    """The answer recorded on a receipt of the proxy on `db`, opened with the secret.key beside it
    (store/sealing.py)."""
    from proxy_addon.store.sealing import AnswerSeal

    assert receipt.response is not None, f"receipt {receipt.operation_id} has no recorded answer"
    key = (Path(db).parent / "secret.key").read_bytes().strip()  # as fingerprint.load_or_create_key reads it
    return AnswerSeal(key).open(receipt.operation_id, receipt.response)


@pytest.fixture(scope="session")
def upstream():
    with Upstream() as up:
        yield up


@pytest.fixture(scope="session")
def tls_upstream(tmp_path_factory):
    with Upstream(tls=True, certdir=tmp_path_factory.mktemp("upstream-cert")) as up:
        yield up


@pytest.fixture(scope="session")
def unruled_tls_upstream(tmp_path_factory):
    """An HTTPS upstream on 127.0.0.2: loopback, but no name of it is in the test rules (which name
    127.0.0.1, and so localhost and ::1 too), so the proxy tunnels its TLS untouched."""
    with Upstream(tls=True, certdir=tmp_path_factory.mktemp("unruled-cert"), host="127.0.0.2") as up:
        yield up


@pytest.fixture
def h2_upstream(tls_upstream):
    """An HTTP/2 upstream of this test's own (a new port: the proxy's exchange opens a new connection to it),
    with the certificate of `tls_upstream`, which the test proxies trust."""
    from tests.upstream_h2 import H2Upstream

    with H2Upstream(certdir=tls_upstream.certdir) as up:
        yield up


@pytest.fixture
def bucket() -> str:
    """A path segment of this test's own, so upstream commit counts and receipts never mix."""
    return f"b{uuid.uuid4().hex[:12]}"


# --- PostgreSQL (tests/pg.py): one throwaway server per session, a fresh schema per test ---

PG_SKIPPED: list[str] = []  # why the PostgreSQL tests skipped (said once more at the end of the run)


@pytest.fixture(scope="session")
def pg_cluster(tmp_path_factory):
    """A PostgreSQL server: RECEIPTS_TEST_PG's, else one started from Debian's binaries; skips when neither."""
    reason = pg.unavailable()
    if reason:
        if not PG_SKIPPED:
            PG_SKIPPED.append(reason)
        pytest.skip(f"PostgreSQL tests skipped: {reason}")
    cluster = pg.Cluster.find()
    try:
        yield cluster
    finally:
        # For the marker secrets sweep (it reads *.db* files under the base temp dir): every row the tests wrote.
        with contextlib.suppress(Exception):
            (tmp_path_factory.getbasetemp() / "postgresql-rows.db").write_bytes(cluster.dump())
        cluster.destroy()


@pytest.fixture
def pg_url(pg_cluster) -> str:
    """A database URL of this test's own (a fresh schema on the session's PostgreSQL)."""
    return pg_cluster.new_schema()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.e2e)])
def backend_db(request, tmp_path) -> str:
    """A receipts database of this test's own, on each backend: a SQLite file, or a PostgreSQL URL."""
    if request.param == "postgres":
        return request.getfixturevalue("pg_url")
    return str(tmp_path / "receipts.db")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend_store(backend_db, clock):
    """The store on `backend_db` (each backend), on the test's `clock`; closed after the test."""
    from proxy_addon.store import open_store

    s = open_store(backend_db, clock=clock)
    yield s
    s.close()


# --- no marker secret in any receipts DB, WAL or proxy log: checked once, after the last test ---

STARTED: list[Proxy] = []  # every Proxy this run started (Proxy.start)
RECORDED_TOKEN: list[Proxy] = []  # proxies that answered a Clients.send (a URL with ?token=) with a receipt


class Sweep(TypedDict, total=False):
    dbs: int
    logs: int
    redacted: bool
    problems: list[str]


SWEEP: Sweep = {}  # what the sweep checked, for the end-of-run summary line


def receipts_files(base: Path) -> tuple[set[Path], set[Path]]:
    """
    Every receipts DB file (the DB, its -wal, -shm, -journal) and every log under `base`; with the logs,
    every OpenTelemetry export a test's receiver kept as it came (*.otlp: tests/e2e/otlp_receiver.py).
    """
    dbs = {p for p in base.rglob("*.db*") if p.is_file() and not p.name.endswith(".lock")}
    logs = {p for p in base.rglob("*.log") if p.is_file()} | {p for p in base.rglob("*.otlp") if p.is_file()}
    return dbs, logs


def read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:  # a WAL removed as its last connection closed: its pages are in the DB
        return b""


def marker_secrets_in(paths: Iterable[Path]) -> list[str]:
    """One line per marker secret found in one of `paths`."""
    found = []
    for path in sorted(set(paths)):
        data = read(path)
        found += [
            f"the {name} secret ({secret}) is in {path}" for name, secret in SECRETS.items() if secret.encode() in data
        ]
    return found


@pytest.fixture(scope="session", autouse=True)
def no_marker_secret_anywhere(tmp_path_factory):
    """
    After the last test of the run, whichever tests ran: every request sent with Clients
    carried the marker SECRETS in Authorization, Cookie, an api-key header, a ?token= and
    an ?x_thing= query (a name on no list), and tests/e2e/proxy/test_intent_secrets.py sends one in a body
    object (nested.blob); none of them may be in any receipts DB, its WAL, or any log the run wrote:
    all of them under the run's base temp directory, plus the DB and log of every Proxy
    started (wherever they are). If a proxy recorded a receipt for such a request, the
    ?token= value must show as token=REDACTED in the DBs and in that proxy's log: redacted,
    not dropped silently. A failure here is reported as an error at the teardown of the
    run's last test, and fails the run.

    Session-scoped and autouse, so it is set up before any other fixture and torn down
    after all of them: every proxy has stopped when it looks.
    """
    yield
    for proxy in STARTED:  # a last net: a proxy a failed test left running does not outlive the run
        with contextlib.suppress(Exception):
            proxy.stop()
    dbs, logs = receipts_files(tmp_path_factory.getbasetemp())
    for proxy in STARTED:  # the run's proxies, even one with its DB outside the base temp directory
        dbs |= {
            f for f in (Path(proxy.db), *(Path(f"{proxy.db}{x}") for x in ("-wal", "-shm", "-journal"))) if f.is_file()
        }
        logs.add(proxy.log_path)
    problems = marker_secrets_in(dbs | logs)
    if RECORDED_TOKEN:
        if b"token=REDACTED" not in b"".join(read(p) for p in dbs):
            problems.append(
                f"no token=REDACTED in any of {len(dbs)} DB files, though receipts were recorded for URLs with ?token="
            )
        if not any("token=REDACTED" in p.log() for p in RECORDED_TOKEN):
            problems.append(
                "no token=REDACTED in the log of any proxy that recorded a URL with ?token=: "
                + ", ".join(str(p.log_path) for p in RECORDED_TOKEN)
            )
    SWEEP.update(Sweep(dbs=len(dbs), logs=len(logs), redacted=bool(RECORDED_TOKEN), problems=problems))
    if problems:
        pytest.fail("MARKER SECRETS SWEEP FAILED:\n  " + "\n  ".join(problems), pytrace=False)


E2E = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(config, items):
    """
    Every test under tests/e2e/ is marked `e2e` (it starts real processes): `-m "not e2e"` leaves them out. The soak
    (minutes long, marked `soak`) goes first, so that pytest-xdist starts it at once and the other workers run the
    rest meanwhile, instead of one worker starting it near the end.
    """
    for item in items:
        if E2E in item.path.parents:
            item.add_marker(pytest.mark.e2e)
    items.sort(key=lambda item: item.get_closest_marker("soak") is None)  # stable: the rest keep their order


def pytest_sessionfinish(session):
    """Under pytest-xdist, a worker hands what its sweep and its PostgreSQL fixture found to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["receipts_sweep"] = json.dumps(SWEEP)
        workeroutput["receipts_pg_skipped"] = json.dumps(PG_SKIPPED)


def pytest_testnodedown(node, error):
    """The controller (pytest-xdist): sum the workers' sweeps, keep why PostgreSQL tests skipped."""
    out = getattr(node, "workeroutput", {})
    sweep = json.loads(out.get("receipts_sweep", "{}"))
    if sweep:
        SWEEP["dbs"] = SWEEP.get("dbs", 0) + sweep["dbs"]
        SWEEP["logs"] = SWEEP.get("logs", 0) + sweep["logs"]
        SWEEP["redacted"] = SWEEP.get("redacted", False) or sweep["redacted"]
        SWEEP["problems"] = SWEEP.get("problems", []) + sweep["problems"]
    for reason in json.loads(out.get("receipts_pg_skipped", "[]")):
        if not PG_SKIPPED:
            PG_SKIPPED.append(reason)


def pytest_terminal_summary(terminalreporter):
    if PG_SKIPPED:
        terminalreporter.write_line(f"PostgreSQL tests skipped: {PG_SKIPPED[0]}", yellow=True, bold=True)
    if not SWEEP:
        return
    if SWEEP["problems"]:
        terminalreporter.write_line(
            f"marker secrets sweep: FAILED ({len(SWEEP['problems'])} problems, see the error at teardown)",
            red=True,
            bold=True,
        )
    else:
        terminalreporter.write_line(
            f"marker secrets sweep: no marker secret in {SWEEP['dbs']} DB/WAL files or {SWEEP['logs']} logs"
            + (", token=REDACTED found" if SWEEP["redacted"] else "")
        )
