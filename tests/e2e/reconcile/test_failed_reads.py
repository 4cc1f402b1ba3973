"""
A reconcile read that fails proves nothing: the receipt stays `outcome_unknown`, with the
failure and the time of its next read in its history, and goes to `manual_review` only after
`receipts_read_attempts` failed reads (2 here) or past `receipts_read_deadline`.

One table, both callers (as tests/e2e/reconcile/test_paths.py): a duplicate at a real mitmdump
(`receipts_read_attempts=2`, `receipts_read_backoff=1`, `receipts_read_timeout=1`, real waits
of at most 2 s) and `receipts reconcile` (the same numbers as flags, on a FakeClock). The
upstream counts the reads; the TLS case reads from a server whose certificate nobody trusts,
which counts the connections made to it. Retry-After itself: tests/reconcile/test_judge.py.
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

import pytest

from proxy_addon.cli import main
from proxy_addon.store import Event, Receipt, Store, iso
from tests.conftest import FakeClock
from tests.e2e.processes import Clients, Proxy
from tests.e2e.reconcile.test_reconcile import unknown_write
from tests.upstream import make_self_signed_cert

ATTEMPTS, BACKOFF, PROXY_READ_TIMEOUT = 2, 1, 1


CLI_FLAGS = ("--read-attempts", str(ATTEMPTS), "--read-backoff", str(BACKOFF), "--timeout", "0.5")


RULES = """\
api: failed-reads
hosts: [127.0.0.1]
credentials: {header: api-key}
operations:
  things.create:
    description: A complete list on the write's own origin
    match: {method: POST, path: "/api/{bucket}/things"}
    fingerprint: {body: [title]}
    external_id: id
    reconcile:
      read: {method: GET, url: "/api/{path.bucket}/things"}
      find: {title: "{intent.title}"}
      absence_provable: true
      retry_when_absent: true
      external_id: id
  tls.create:
    description: The same, read from an HTTPS server whose certificate nobody trusts
    match: {method: POST, path: "/api/{bucket}/tls"}
    fingerprint: {body: [title]}
    external_id: id
    reconcile:
      read: {method: GET, url: "https://127.0.0.1:TLS_PORT/api/{path.bucket}/tls"}
      find: {title: "{intent.title}"}
      absence_provable: true
      retry_when_absent: true
"""


class UntrustedTLS:
    """A TLS server on 127.0.0.1 with a self-signed certificate no client here trusts: every
    read to it fails its handshake (CERTIFICATE_VERIFY_FAILED). It counts the connections."""

    def __init__(self, certdir):
        cert, key = make_self_signed_cert(certdir)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with self.lock:
                self.connections += 1
            conn.settimeout(5)
            try:
                self.context.wrap_socket(conn, server_side=True).close()  # the client refuses the certificate
            except (ssl.SSLError, OSError):
                conn.close()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture(scope="module")
def untrusted(tmp_path_factory):
    server = UntrustedTLS(tmp_path_factory.mktemp("untrusted-cert"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rules(tmp_path_factory, untrusted):
    path = tmp_path_factory.mktemp("failed-reads-rules") / "failed-reads.yaml"
    path.write_text(RULES.replace("TLS_PORT", str(untrusted.port)))
    return path


@pytest.fixture(scope="module")
def fr_proxy(tmp_path_factory, confdir, rules):
    """A proxy that trusts no private CA, reads for a duplicate at most twice, and waits a second after a failure."""
    p = Proxy(
        tmp_path_factory.mktemp("failed-reads-proxy"),
        confdir,
        rules=rules,
        extra=(
            "--set",
            f"receipts_read_attempts={ATTEMPTS}",
            "--set",
            f"receipts_read_backoff={BACKOFF}",
            "--set",
            f"receipts_read_timeout={PROXY_READ_TIMEOUT}",
        ),
    )
    p.start()
    yield p
    p.stop()


@pytest.fixture(autouse=True)
def no_trusted_ca_from_the_environment(monkeypatch):
    """The CLI trusts $SSL_CERT_FILE: never the untrusted server's certificate."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)


def look(db, operation_id: str) -> tuple[Receipt, list[Event]]:
    store = Store.open(db, create=False)
    try:
        return store.get(operation_id), store.events(operation_id)
    finally:
        store.close()


def transitions(events: list[Event]) -> list[Event]:
    return [e for e in events if e.event == "transition"]


def when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


@dataclass
class Got:
    """What one caller's attempt gave: the proxy's answer to a duplicate, or the CLI's exit status and output."""

    status: int | None = None
    headers: dict = field(default_factory=dict)  # the proxy's answer (the CLI's: none)
    body: dict = field(default_factory=dict)
    code: int | None = None
    out: str = ""
    err: str = ""


def try_again(
    caller: str,
    proxy: Proxy,
    upstream,
    url: str,
    body: dict,
    operation_id: str,
    at: dt.datetime,
    clock: FakeClock,
    capsys,
    rules,
) -> Got:
    """At `at`, the caller tries to settle the receipt: the proxy gets a duplicate (after a real wait until
    then, at most 3 s), or `receipts reconcile` runs with its clock set to then."""
    if caller == "proxy":
        wait = (at - dt.datetime.now(dt.UTC)).total_seconds()
        assert wait <= 3, wait
        time.sleep(max(0.0, wait))
        answer = Clients(proxy).send("requests", "POST", url, body)
        return Got(status=answer.status, headers=answer.headers, body=answer.json())
    clock.now = at
    capsys.readouterr()
    code = main(["--db", str(proxy.db), "reconcile", operation_id, "--rules", str(rules), *CLI_FLAGS], clock=clock)
    out, err = capsys.readouterr()
    return Got(code=code, out=out, err=err)


# kind (the write's path), the read's fault (None: the kind alone breaks it), a fragment of the failed
# read's reason, and how long its answer makes the next read wait: Retry-After, else the backoff.
FAULTS = [
    pytest.param("things", "500", "→ HTTP 500: the read failed, nothing is proven", BACKOFF, id="answers-500"),
    pytest.param("things", "429", "→ HTTP 429: the read failed, nothing is proven", 2, id="answers-429-retry-after"),
    pytest.param("things", "hang", "failed: ReadTimeout", BACKOFF, id="hangs-past-the-read-timeout"),
    pytest.param("tls", None, "CERTIFICATE_VERIFY_FAILED", BACKOFF, id="tls-certificate-not-trusted"),
    pytest.param("things", "deepjson", "the answer is not JSON", BACKOFF, id="json-nested-too-deep"),
]


@pytest.mark.parametrize("caller", ["proxy", "cli"])
@pytest.mark.parametrize("kind, fault, reason, delay", FAULTS)
def test_a_failed_read_leaves_the_outcome_unknown_until_the_last_attempt(
    caller, fr_proxy, upstream, untrusted, rules, bucket, capsys, kind, fault, reason, delay
):
    path = f"/api/{bucket}/{kind}"
    url, body = f"{upstream.url}{path}", {"title": f"failing {fault or kind}"}
    r = unknown_write(Clients(fr_proxy), fr_proxy, upstream, bucket, kind, body, "drop")
    if fault:
        upstream.plan_read(path, fault, fault)

    def reads() -> int:
        return untrusted.connections if kind == "tls" else upstream.reads(path)

    before = reads()
    clock = FakeClock(dt.datetime.now(dt.UTC))
    again = lambda at: try_again(caller, fr_proxy, upstream, url, body, r.operation_id, at, clock, capsys, rules)  # noqa: E731

    # 1. The first try reads, the read fails: nothing is proven, the outcome stays unknown.
    got = again(clock.now)
    receipt, events = look(fr_proxy.db, r.operation_id)
    assert reads() == before + 1
    assert (receipt.state, receipt.failed_reads) == ("outcome_unknown", 1)
    failure = transitions(events)[-1]
    assert (failure.from_state, failure.to_state) == ("reconciling", "outcome_unknown")
    assert reason in failure.reason, failure.reason
    assert receipt.next_read_at is not None
    next_read = when(receipt.next_read_at)
    assert f"failed read 1 of {ATTEMPTS}: next read not before {receipt.next_read_at}" in failure.reason
    assert ("(as Retry-After says)" if fault == "429" else "(backoff)") in failure.reason
    assert abs((next_read - when(failure.at)).total_seconds() - delay) < 0.5  # Retry-After, else the backoff
    if caller == "proxy":
        assert (got.status, got.body["error"], got.body["state"]) == (409, "duplicate_unresolved", "outcome_unknown")
        assert when(got.body["retry_after"]) == next_read
        assert 1 <= int(got.headers["retry-after"]) <= delay + 1
        assert "failed" in got.body["hint"]
    else:
        assert got.code == 1
        assert got.err.startswith("Error: 1 read failed and proved nothing:\n")
        assert f"  {r.operation_id} failed-reads/{kind}.create: " in got.err and reason in got.err
        assert f"next read not before {receipt.next_read_at}" in got.err
        assert got.out.startswith(f"{r.operation_id}  outcome_unknown → outcome_unknown  ")

    # 2. Inside the wait: no read. The proxy answers 409 with Retry-After, the CLI says when.
    got = again(next_read - dt.timedelta(seconds=0.4))
    assert reads() == before + 1
    receipt, later = look(fr_proxy.db, r.operation_id)
    assert (receipt.state, receipt.failed_reads, receipt.next_read_at) == ("outcome_unknown", 1, iso(next_read))
    assert transitions(later) == transitions(events)  # nothing claimed it
    if caller == "proxy":
        assert (got.status, got.body["state"]) == (409, "outcome_unknown")
        assert when(got.body["retry_after"]) == next_read and int(got.headers["retry-after"]) >= 1
        assert [e.event for e in later[len(events) :]] == ["blocked"]
    else:
        assert (got.code, got.err) == (0, "")
        assert got.out == (
            f"{r.operation_id}  outcome_unknown  not read: next read after {iso(next_read)} "
            "(1 failed read so far); --now reads it at once\n"
        )

    # 3. After the wait the next try reads again; it fails too, the last allowed: manual_review.
    got = again(next_read + dt.timedelta(seconds=0.05))
    assert reads() == before + 2
    receipt, events = look(fr_proxy.db, r.operation_id)
    assert (receipt.state, receipt.failed_reads, receipt.next_read_at) == ("manual_review", 2, None)
    last = transitions(events)[-1]
    assert (last.from_state, last.to_state) == ("reconciling", "manual_review")
    assert reason in last.reason and f"failed read 2 of {ATTEMPTS}: manual review" in last.reason, last.reason
    if caller == "proxy":
        assert (got.status, got.body["state"]) == (409, "manual_review")
        assert "retry-after" not in got.headers and "resolve it" in got.body["hint"]
    else:
        assert got.code == 1 and r.operation_id in got.err and "failed read 2 of 2: manual review" in got.err
    assert upstream.seen(path) == 1  # a read, never another write


def unknown(fr_proxy, upstream, bucket, title: str):
    path = f"/api/{bucket}/things"
    r = unknown_write(Clients(fr_proxy), fr_proxy, upstream, bucket, "things", {"title": title}, "drop")
    assert r.completed_at is not None
    return r, path, FakeClock(when(r.completed_at))


def cli(capsys, db, rid: str, rules, clock: FakeClock, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--db", str(db), "reconcile", rid, "--rules", str(rules), *argv], clock=clock)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv, after, expected",
    [
        pytest.param((), 25 * 3600, "more than 86400s", id="default-24h"),
        pytest.param(("--read-deadline", "1h"), 2 * 3600, "more than 3600s", id="read-deadline-1h"),
        pytest.param(("--read-deadline", "1h"), 30 * 60, None, id="within-1h"),
    ],
)
def test_a_read_that_fails_past_the_deadline_goes_to_manual_review(
    fr_proxy, upstream, rules, bucket, capsys, argv, after, expected
):
    r, path, clock = unknown(fr_proxy, upstream, bucket, f"deadline {after}")
    upstream.plan_read(path, "500")
    clock.advance(after)
    code, out, err = cli(capsys, fr_proxy.db, r.operation_id, rules, clock, *argv)
    receipt, events = look(fr_proxy.db, r.operation_id)
    assert code == 1 and r.operation_id in err
    assert receipt.failed_reads == 1 and upstream.reads(path) == 1
    if expected is None:  # within the deadline, the first of three: it waits for its next read
        assert receipt.state == "outcome_unknown" and "failed read 1 of 3: next read not before" in out
    else:
        assert receipt.state == "manual_review"
        assert f"failed read 1 of 3, and the outcome has been unknown since {iso(when(r.completed_at))}" in out
        assert expected in events[-1].reason and events[-1].reason.endswith(": manual review")


def test_now_reads_a_receipt_that_waits_and_a_found_effect_settles_it(fr_proxy, upstream, rules, bucket, capsys):
    r, path, clock = unknown(fr_proxy, upstream, bucket, "found after all")
    upstream.plan_read(path, "503")
    assert cli(capsys, fr_proxy.db, r.operation_id, rules, clock)[0] == 1
    assert look(fr_proxy.db, r.operation_id)[0].state == "outcome_unknown"
    code, out, _ = cli(capsys, fr_proxy.db, r.operation_id, rules, clock)  # still waiting: not read
    assert (code, upstream.reads(path)) == (0, 1) and "not read: next read after" in out
    code, out, err = cli(capsys, fr_proxy.db, r.operation_id, rules, clock, "--now", "--json")
    assert (code, err, upstream.reads(path)) == (0, "", 2)
    receipt = look(fr_proxy.db, r.operation_id)[0]
    assert (receipt.state, receipt.external_id) == ("succeeded", "1")
    assert (receipt.failed_reads, receipt.next_read_at) == (1, None)
    assert '"skipped": false' in out and '"state": "succeeded"' in out


def test_a_retry_after_past_the_deadline_goes_to_manual_review_at_once(fr_proxy, upstream, rules, bucket, capsys):
    """The API asks for more time than the deadline leaves: no read could come in time."""
    r, path, clock = unknown(fr_proxy, upstream, bucket, "rate limited")
    upstream.plan_read(path, "429")  # Retry-After: 2
    code, out, _ = cli(capsys, fr_proxy.db, r.operation_id, rules, clock, "--read-deadline", "1")
    receipt = look(fr_proxy.db, r.operation_id)[0]
    assert (code, receipt.state, receipt.failed_reads) == (1, "manual_review", 1)
    assert "as Retry-After says) would come after the deadline" in out
