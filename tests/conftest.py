"""
Fixtures for integration tests: a real mitmdump process with the addon, in front of a
real upstream (tests/upstream.py) on 127.0.0.1, driven by real clients.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.upstream import Upstream, free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ADDON = ROOT / "proxy_addon" / "addon.py"
TEST_RULES = ROOT / "tests" / "rules_it"

# Marker secrets: every integration request carries them; none may reach the DB.
SECRETS = {
    "authorization": "Bearer SECRET-AUTH-7f3a9c",
    "cookie": "session=SECRET-COOKIE-51d2e8",
    "api-key": "SECRET-APIKEY-c0ffee",
    "token": "SECRET-QUERY-b16b00b5",
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


class Proxy:
    """A mitmdump process with the receipts addon; stopped by PID."""

    def __init__(self, workdir: Path, confdir: Path, *, db: Path | None = None, rules: Path = TEST_RULES,
                 upstream_ca: Path | None = None, extra: tuple[str, ...] = ()):
        self.workdir = workdir
        self.confdir = confdir
        self.db = db or workdir / "receipts.db"
        self.rules = rules
        self.upstream_ca = upstream_ca
        self.extra = extra
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = workdir / f"proxy-{uuid.uuid4().hex[:6]}.log"

    def args(self) -> list[str]:
        args = [str(BIN / "mitmdump"), "--listen-host", "127.0.0.1", "-p", str(self.port),
                "--set", f"confdir={self.confdir}", "-s", str(ADDON),
                "--set", f"receipts_db={self.db}", "--set", f"receipts_rules={self.rules}",
                "--set", "flow_detail=0"]  # as scripts/run --headless: mitmdump would print raw URLs
        if self.upstream_ca:
            args += ["--set", f"ssl_verify_upstream_trusted_ca={self.upstream_ca}"]
        return args + list(self.extra)

    def start(self, wait: bool = True) -> Proxy:
        self.port = self.port or free_port()
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args(), stdout=self._log, stderr=subprocess.STDOUT, cwd=self.workdir,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if wait:
            wait_for(self._ready, timeout=20, what=f"mitmdump on port {self.port} (log: {self.log_path})")
        return self

    def _ready(self) -> bool:
        if self.proc and self.proc.poll() is not None:
            raise AssertionError(f"mitmdump exited with {self.proc.returncode}:\n{self.log()}")
        # mitmproxy may bind its port before the addon is configured: wait for the addon's word.
        return "receipt-proxy: ready" in self.log()

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
        return f"http://127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.confdir / "mitmproxy-ca-cert.pem"


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
        url = f"{url}{sep}token={SECRETS['token']}"
        return getattr(self, f"_{client}")(method, url, data, headers, timeout)

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
