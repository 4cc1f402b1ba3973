"""
Fixtures for integration tests: a real mitmdump process with the addon, in front of a
real upstream (tests/upstream.py) on 127.0.0.1, driven by real clients.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import pg
from tests.upstream import MINTED_KEY, MINTED_TOKEN, Upstream, free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ADDON = ROOT / "proxy_addon" / "addon.py"
TEST_RULES = ROOT / "tests" / "rules_it"

# Marker secrets: every integration request carries them (but the minted ones, which an answer
# carries); none may reach the DB.
# x_thing and blob are names on no list of secret names: a query parameter every Clients request
# carries, and a body key (nested.blob) that tests/test_intent_secrets.py sends; redacted all the same.
# path_token and path_room: tokens in a request's path (tests/test_other_callers.py), REDACTED and hashed.
SECRETS = {
    "authorization": "Bearer SECRET-AUTH-7f3a9c",
    "cookie": "session=SECRET-COOKIE-51d2e8",
    "api-key": "SECRET-APIKEY-c0ffee",
    "token": "SECRET-QUERY-b16b00b5",
    "x_thing": "SECRET-XTHING-5eed1e",
    "blob": "SECRET-BLOB-0b1e55",
    # path credentials tests/test_other_callers.py sends: a Telegram bot token's shape, and a declared one
    "path_token": "555555555:SECRET-PATH-TOKEN-9d2c41_abcdefghijklmnop",
    "path_room": "SECRET-PATH-ROOM-4e7f10",
    # minted by the upstream in its answer to a write (its "mint" fault): the recorded answer is sealed
    "minted_key": MINTED_KEY,
    "minted_token": MINTED_TOKEN,
}


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    """Poll `predicate` until it returns something truthy, at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
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


# What mitmproxy logs once a proxy mode has bound its socket (proxy/mode_servers.py:
# "<mode description> listening at <address>."). With `-p 0` the kernel picks the port at bind
# time and this line is the only place that says which: there is no window in which another
# process could take it, as there is between probing a free port and binding it.
LISTENING = re.compile(r"(?:HTTP\(S\) proxy|SOCKS v5 proxy|reverse proxy)[^\n]* listening at 127\.0\.0\.1:(\d+)\.")



def stop_process(proc: subprocess.Popen | None) -> None:
    """Stop a process this test started, by its PID: SIGTERM, then SIGKILL after 10 s."""
    if proc and proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

class Proxy:
    """A mitmdump process with the receipts addon, on a port the kernel picks; stopped by PID."""

    def __init__(self, workdir: Path, confdir: Path, *, db: Path | None = None, rules: Path = TEST_RULES,
                 upstream_ca: Path | None = None, extra: tuple[str, ...] = ()):
        self.workdir = workdir
        self.confdir = confdir
        self.db = db or workdir / "receipts.db"
        self.rules = rules
        self.upstream_ca = upstream_ca
        self.extra = extra
        self.port = 0  # known once started: read from mitmproxy's "listening at" line
        self.proc: subprocess.Popen | None = None
        self.log_path = workdir / f"proxy-{uuid.uuid4().hex[:6]}.log"
        self._log_from = 0  # where this start's lines begin in the log (a restart appends to it)

    def args(self) -> list[str]:
        args = [str(BIN / "mitmdump"), "--listen-host", "127.0.0.1", "-p", "0",
                "--set", f"confdir={self.confdir}", "-s", str(ADDON),
                "--set", f"receipts_db={self.db}", "--set", f"receipts_rules={self.rules}",
                "--set", "flow_detail=0"]  # as scripts/run --headless: mitmdump would print raw URLs
        if self.upstream_ca:
            args += ["--set", f"ssl_verify_upstream_trusted_ca={self.upstream_ca}"]
        return args + list(self.extra)

    def start(self, wait: bool = True) -> Proxy:
        """Start mitmdump; with `wait`, return once it listens and the addon is ready (else call ready())."""
        self.port = 0
        self._log = open(self.log_path, "ab")
        self._log_from = self._log.tell()
        self.proc = subprocess.Popen(self.args(), stdout=self._log, stderr=subprocess.STDOUT, cwd=self.workdir,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        STARTED.append(self)
        if wait:
            self.ready()
        return self

    def ready(self) -> Proxy:
        wait_for(self._ready, timeout=20, what=f"mitmdump to listen and the addon to be ready (log: {self.log_path})")
        return self

    def _ready(self) -> bool:
        if self.proc and self.proc.poll() is not None:
            raise AssertionError(f"mitmdump exited with {self.proc.returncode}:\n{self.log()}")
        text = self.log_path.read_bytes()[self._log_from:].decode(errors="replace")
        listening = LISTENING.search(text)
        # mitmproxy may bind its port before the addon is configured: wait for the addon's word too.
        if not (listening and "receipt-proxy: ready" in text):
            return False
        self.port = int(listening.group(1))
        return True

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if self.proc:
            self._log.close()
        return self.proc.returncode if self.proc else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def url(self) -> str:
        assert self.port, "the proxy's port is known once it is ready (Proxy.start or Proxy.ready)"
        return f"http://127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.confdir / "mitmproxy-ca-cert.pem"


# scripts/run's banner line with mitmweb's URL and the token it chose (mitmweb's own line then has none).
WEB_URL = re.compile(r"^Web UI: (http://127\.0\.0\.1:\d+/\?token=[0-9a-f]+) ", re.M)
WEB_LISTENING = "Web server listening at http://127.0.0.1:"
METRICS_URL = re.compile(r"Prometheus metrics at (http://127\.0\.0\.1:\d+/metrics)")  # the addon's log line


class ScriptsRun:
    """
    `scripts/run` (mitmweb; mitmdump with --headless) with its own state dir (`workdir/state`);
    stopped by PID (scripts/run execs mitmproxy, so this PID is mitmproxy's).

    The proxy port is 0 (RECEIPT_PROXY_PORT=0) and read from mitmproxy's log. mitmweb's web
    port cannot be 0 (mitmweb would bind a random port but announce its URL with port 0), so it
    is a free_port(): should mitmweb still fail to bind it, scripts/run is started again on
    another port, at most `attempts` times. Prometheus metrics are served on a port the kernel
    picks (RECEIPT_PROXY_METRICS=127.0.0.1:0, not scripts/run's 9464, which runs at once would
    share), read from the addon's log line: `metrics_url`.
    """

    def __init__(self, workdir: Path, confdir: Path, args: tuple[str, ...] = (), *, log: Path | None = None,
                 env: dict[str, str] | None = None, attempts: int = 5):
        self.workdir, self.confdir, self.args, self.attempts = workdir, confdir, tuple(args), attempts
        self.headless = "--headless" in self.args
        self.log_path = log or workdir / "run.log"
        self.env = {"RECEIPT_PROXY_STATE_DIR": str(workdir / "state"), "RECEIPT_PROXY_RULES": str(TEST_RULES),
                    "RECEIPT_PROXY_METRICS": "127.0.0.1:0", **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.proxy_url = self.web_url = self.metrics_url = ""
        self.tries = 0

    def start(self) -> ScriptsRun:
        for attempt in range(1, self.attempts + 1):
            self.tries = attempt
            env = {**os.environ, **self.env, "RECEIPT_PROXY_PORT": "0",
                   "RECEIPT_PROXY_WEB_PORT": str(free_port()), "PYTHONUNBUFFERED": "1"}
            with open(self.log_path, "ab") as out:
                start = out.tell()
                self.proc = subprocess.Popen([str(ROOT / "scripts" / "run"), *self.args, "--",
                                              "--set", f"confdir={self.confdir}"],
                                             stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.workdir)
            try:
                outcome = wait_for(lambda start=start: self._ready(start), timeout=120,
                                   what=f"scripts/run to be ready (log: {self.log_path})")
            except BaseException:
                self.stop()
                raise
            if outcome is not True:
                return self
            # mitmweb could not bind its web port after all (taken since free_port()): try another.
        raise AssertionError(f"scripts/run found no free web port in {self.attempts} attempts:\n{self.log()}")

    def _ready(self, start: int) -> str | bool | None:
        """The proxy URL once ready; True if mitmweb exited for want of its web port; None meanwhile."""
        assert self.proc is not None
        text = self.log_path.read_bytes()[start:].decode(errors="replace")
        if self.proc.poll() is not None:
            if "Web server failed to listen" in text and "Address already in use" in text:
                return True
            if "error: RECEIPT_PROXY_WEB_PORT=" in text and "is taken" in text:  # scripts/run's own check
                return True
            raise AssertionError(f"scripts/run exited with {self.proc.returncode}:\n{text}")
        listening, web = LISTENING.search(text), WEB_LISTENING in text and WEB_URL.search(text)
        if "receipt-proxy: ready" not in text or not listening or not (self.headless or web):
            return None
        self.proxy_url = f"http://127.0.0.1:{listening.group(1)}"
        self.web_url = web.group(1) if web else ""
        self.metrics_url = m.group(1) if (m := METRICS_URL.search(text)) else ""
        return self.proxy_url

    def stop(self) -> None:
        stop_process(self.proc)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def mitmweb(tmp_path: Path, confdir: Path) -> Iterator[tuple[str, str]]:
    """`scripts/run` with its own state dir and ports; yields (proxy URL, mitmweb URL with token); stops it by PID."""
    run = ScriptsRun(tmp_path, confdir, log=tmp_path / "mitmweb.log").start()
    try:
        yield run.proxy_url, run.web_url
    finally:
        run.stop()


@dataclass
class Answer:
    """What a client got: a status, headers and body, or the name of the exception it raised."""

    status: int | None
    headers: dict[str, str]
    body: bytes
    error: str | None = None

    def json(self):
        return json.loads(self.body)


class Clients:
    """One way to send a request for each real client: requests, httpx, curl (through proxy variables)."""

    def __init__(self, proxy: Proxy):
        self.proxy = proxy

    def send(self, client: str, method: str, url: str, body: dict | bytes | None = None, *,
             headers: dict[str, str] | None = None, timeout: float = 10.0) -> Answer:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        headers = {"Content-Type": "application/json", **SECRETS_HEADERS, **(headers or {})}
        sep = "&" if "?" in url else "?"
        url = f"{url}{sep}token={SECRETS['token']}&x_thing={SECRETS['x_thing']}"
        answer = getattr(self, f"_{client}")(method, url, data, headers, timeout)
        if "x-receipt-id" in answer.headers and self.proxy not in RECORDED_TOKEN:
            RECORDED_TOKEN.append(self.proxy)  # this proxy wrote a receipt for a URL with ?token=
        return answer

    def _requests(self, method, url, data, headers, timeout) -> Answer:
        import requests

        try:
            r = requests.request(method, url, data=data, headers=headers, timeout=timeout,
                                 proxies={"http": self.proxy.url, "https": self.proxy.url}, verify=str(self.proxy.ca))
        except requests.RequestException as e:
            return Answer(None, {}, b"", type(e).__name__)
        return Answer(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content)

    def _httpx(self, method, url, data, headers, timeout) -> Answer:
        import ssl

        import httpx

        ctx = ssl.create_default_context(cafile=str(self.proxy.ca))
        try:
            with httpx.Client(proxy=self.proxy.url, verify=ctx, trust_env=False, timeout=timeout) as c:
                r = c.request(method, url, content=data, headers=headers)
        except httpx.HTTPError as e:
            return Answer(None, {}, b"", type(e).__name__)
        return Answer(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content)

    def _curl(self, method, url, data, headers, timeout) -> Answer:
        cmd = ["curl", "-sS", "-X", method, "-D", "-", "--max-time", str(timeout), "--cacert", str(self.proxy.ca)]
        for k, v in headers.items():
            cmd += ["-H", f"{k}: {v}"]
        if data is not None:
            cmd += ["--data-binary", "@-"]
        env = {**os.environ, "http_proxy": self.proxy.url, "HTTPS_PROXY": self.proxy.url, "NO_PROXY": "", "no_proxy": ""}
        p = subprocess.run(cmd + [url], input=data or b"", capture_output=True, env=env, timeout=timeout + 10)
        if p.returncode != 0:
            return Answer(None, {}, b"", f"curl exit {p.returncode}: {p.stderr.decode(errors='replace').strip()}")
        head, _, body = p.stdout.partition(b"\r\n\r\n")
        while b"connection established" in head.lower().split(b"\r\n")[0]:  # the proxy's CONNECT answer
            head, _, body = body.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        return Answer(int(lines[0].split()[1]), hdrs, body)


SECRETS_HEADERS = {"Authorization": SECRETS["authorization"], "Cookie": SECRETS["cookie"], "api-key": SECRETS["api-key"]}
CLIENTS = ["requests", "httpx", "curl"]


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


@contextlib.contextmanager
def next_hop(log: Path, confdir: Path, trusted_ca: Path | None = None) -> Iterator[int]:
    """
    A plain mitmdump as the next proxy of `--mode upstream:http://127.0.0.1:PORT`, yielding its port.
    It intercepts TLS with `confdir`'s CA (the one the proxy under test is told to trust) and trusts
    `trusted_ca` upstream; its log (`log`) lists what went through it. Stopped by its PID.
    """
    port = free_port()
    cmd = [str(Path(sys.executable).parent / "mitmdump"), "--listen-host", "127.0.0.1", "-p", str(port),
           "--set", f"confdir={confdir}"]
    if trusted_ca is not None:
        cmd += ["--set", f"ssl_verify_upstream_trusted_ca={trusted_ca}"]
    with open(log, "wb") as out:
        hop = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "proxy listening" in log.read_text(), what="the next proxy")
        yield port
    finally:
        hop.terminate()
        hop.wait(timeout=10)


TEST_ANSWER_KEY = b"answer-seal-key-of-the-in-process-tests-0123456789abcdef0123456789"


@pytest.fixture(scope="session", autouse=True)
def stores_seal_answers():
    """
    Every store a test opens in this process seals recorded answers with a test key, as the
    proxy's Installation sets one from secret.key (a store without one records no answer:
    tests/test_sealed_answers.py). Proxies in their own process (Proxy, ScriptsRun) use their
    real secret.key.
    """
    from proxy_addon.store.sealing import AnswerSeal
    from proxy_addon.store.transitions import ReceiptTransitions

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ReceiptTransitions, "answer_seal", AnswerSeal(TEST_ANSWER_KEY))
        yield


def recorded_answer(db: Path, receipt):
    """The answer recorded on a receipt of the proxy on `db`, opened with the secret.key beside it (store/sealing.py)."""
    from proxy_addon.store.sealing import AnswerSeal

    assert receipt.response is not None, f"receipt {receipt.operation_id} has no recorded answer"
    key = (Path(db).parent / "secret.key").read_bytes().strip()  # as fingerprint.load_or_create_key reads it
    return AnswerSeal(key).open(receipt.operation_id, receipt.response)


@pytest.fixture(scope="session")
def confdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mitmproxy-conf")


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


@pytest.fixture(scope="session")
def proxy(tmp_path_factory, confdir, tls_upstream):
    """One shared proxy for the tests that only need a proxy; each test uses its own bucket."""
    p = Proxy(tmp_path_factory.mktemp("proxy"), confdir, upstream_ca=tls_upstream.cert_path)
    p.start()
    yield p
    p.stop()


@pytest.fixture
def clients(proxy) -> Clients:
    return Clients(proxy)


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


@pytest.fixture(params=["sqlite", "postgres"])
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

STARTED: list[Proxy] = []         # every Proxy this run started (Proxy.start)
RECORDED_TOKEN: list[Proxy] = []  # proxies that answered a Clients.send (a URL with ?token=) with a receipt
SWEEP: dict[str, object] = {}     # what the sweep checked, for the end-of-run summary line


def receipts_files(base: Path) -> tuple[set[Path], set[Path]]:
    """Every receipts DB file (the DB, its -wal, -shm, -journal) and every log under `base`."""
    dbs = {p for p in base.rglob("*.db*") if p.is_file() and not p.name.endswith(".lock")}
    logs = {p for p in base.rglob("*.log") if p.is_file()}
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
        found += [f"the {name} secret ({secret}) is in {path}"
                  for name, secret in SECRETS.items() if secret.encode() in data]
    return found


@pytest.fixture(scope="session", autouse=True)
def no_marker_secret_anywhere(tmp_path_factory):
    """
    After the last test of the run, whichever tests ran: every request sent with Clients
    carried the marker SECRETS in Authorization, Cookie, an api-key header, a ?token= and
    an ?x_thing= query (a name on no list), and test_intent_secrets.py sends one in a body
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
    dbs, logs = receipts_files(tmp_path_factory.getbasetemp())
    for proxy in STARTED:  # the run's proxies, even one with its DB outside the base temp directory
        dbs |= {f for f in (Path(proxy.db), *(Path(f"{proxy.db}{x}") for x in ("-wal", "-shm", "-journal")))
                if f.is_file()}
        logs.add(proxy.log_path)
    problems = marker_secrets_in(dbs | logs)
    if RECORDED_TOKEN:
        if b"token=REDACTED" not in b"".join(read(p) for p in dbs):
            problems.append(f"no token=REDACTED in any of {len(dbs)} DB files, though receipts were recorded "
                            f"for URLs with ?token=")
        if not any("token=REDACTED" in p.log() for p in RECORDED_TOKEN):
            problems.append("no token=REDACTED in the log of any proxy that recorded a URL with ?token=: "
                            + ", ".join(str(p.log_path) for p in RECORDED_TOKEN))
    SWEEP.update(dbs=len(dbs), logs=len(logs), redacted=bool(RECORDED_TOKEN), problems=problems)
    if problems:
        pytest.fail("MARKER SECRETS SWEEP FAILED:\n  " + "\n  ".join(problems), pytrace=False)


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
        terminalreporter.write_line(f"marker secrets sweep: FAILED ({len(SWEEP['problems'])} problems, see the "
                                    "error at teardown)", red=True, bold=True)
    else:
        terminalreporter.write_line(
            f"marker secrets sweep: no marker secret in {SWEEP['dbs']} DB/WAL files or {SWEEP['logs']} logs"
            + (", token=REDACTED found" if SWEEP["redacted"] else ""))
