"""
The processes the end-to-end tests start, and the clients they drive: a mitmdump with the
receipts addon (`Proxy`), `scripts/run` (`ScriptsRun`, `mitmweb`), a plain mitmdump as the next
hop of the upstream proxy mode (`next_hop`), and one way to send a request with each real client
(`Clients`: requests, httpx, curl). Each process is stopped by its PID (`stop_process`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import RECORDED_TOKEN, ROOT, SECRETS, STARTED, TEST_RULES, deadline, wait_for
from tests.upstream import free_port

BIN = Path(sys.executable).parent


ADDON = ROOT / "proxy_addon" / "addon.py"


# What mitmproxy logs once a proxy mode has bound its socket (proxy/mode_servers.py:
# "<mode description> listening at <address>."). With `-p 0` the kernel picks the port at bind
# time and this line is the only place that says which: there is no window in which another
# process could take it, as there is between probing a free port and binding it.
LISTENING = re.compile(r"(?:HTTP\(S\) proxy|SOCKS v5 proxy|reverse proxy)[^\n]* listening at 127\.0\.0\.1:(\d+)\.")


# How long a process may take to get ready on a quiet machine (22 s were seen for a pack's proxy on a
# loaded one): wait_for scales it to the machine's load (tests/conftest.py, "Deadlines"). A wait for a
# "ready" line ends at that line, and at once if the process died, so a generous bound costs nothing.
READY = 60.0


def tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a process's log, for a failure's message."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def until_ready(proc: subprocess.Popen | None, log: Path, check, what: str, timeout: float = READY):
    """
    Poll `check` (it raises if the process died) until it returns something truthy, as wait_for does
    (scaled); if it never does, stop the process by PID and fail with the log's last lines.
    """
    try:
        return wait_for(check, timeout=timeout, what=f"{what} (log: {log})")
    except BaseException as e:
        stop_process(proc, signal.SIGKILL)
        if isinstance(e, AssertionError) and str(e).startswith("timed out"):
            raise AssertionError(f"{e}; its last lines:\n{tail(log)}") from None
        raise


def stop_process(proc: subprocess.Popen | None, sig: int = signal.SIGTERM) -> None:
    """Stop a process this test started, by its PID: `sig` (SIGTERM), then SIGKILL after 10 s (scaled)."""
    if proc and proc.poll() is None:
        os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=deadline(10))
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=deadline(10))


class Proxy:
    """A mitmdump process with the receipts addon, on a port the kernel picks; stopped by PID."""

    metrics_url = ""  # set by a test that serves metrics (receipts_metrics): the addon's log line (METRICS_URL)

    def __init__(
        self,
        workdir: Path,
        confdir: Path,
        *,
        db: Path | str | None = None,
        rules: Path = TEST_RULES,
        upstream_ca: Path | None = None,
        extra: tuple[str, ...] = (),
    ):
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
        args = [
            str(BIN / "mitmdump"),
            "--listen-host",
            "127.0.0.1",
            "-p",
            "0",
            "--set",
            f"confdir={self.confdir}",
            "-s",
            str(ADDON),
            "--set",
            f"receipts_db={self.db}",
            "--set",
            f"receipts_rules={self.rules}",
            "--set",
            "flow_detail=0",
        ]  # as scripts/run --headless: mitmdump would print raw URLs
        if self.upstream_ca:
            args += ["--set", f"ssl_verify_upstream_trusted_ca={self.upstream_ca}"]
        return args + list(self.extra)

    def start(self, wait: bool = True) -> Proxy:
        """Start mitmdump; with `wait`, return once it listens and the addon is ready (else call ready())."""
        self.port = 0
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - open while mitmdump runs; stop() closes it
        self._log_from = self._log.tell()
        self.proc = subprocess.Popen(
            self.args(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        STARTED.append(self)
        if wait:
            self.ready()
        return self

    def ready(self) -> Proxy:
        """Wait for mitmproxy's "listening at" line and the addon's "receipt-proxy: ready" line; if they never
        come (or the process dies), stop it by PID and fail with the log's tail: nothing outlives a failed start."""
        until_ready(self.proc, self.log_path, self._ready, "mitmdump to listen and the addon to be ready")
        return self

    def _ready(self) -> bool:
        if self.proc and self.proc.poll() is not None:
            raise AssertionError(
                f"mitmdump exited with {self.proc.returncode} (log: {self.log_path}):\n{tail(self.log_path)}"
            )
        text = self.log_path.read_bytes()[self._log_from :].decode(errors="replace")
        listening = LISTENING.search(text)
        # mitmproxy may bind its port before the addon is configured: wait for the addon's word too.
        if not (listening and "receipt-proxy: ready" in text):
            return False
        self.port = int(listening.group(1))
        return True

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        stop_process(self.proc, sig)
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

    @property
    def process(self) -> subprocess.Popen:
        """The mitmdump process start() began (after stop(), the one that ended, with its returncode)."""
        assert self.proc is not None, "the proxy was never started (Proxy.start)"
        return self.proc


def start_all(proxies: list[Proxy]) -> list[Proxy]:
    """Start them all, then wait for each to be ready; if one never is, every one is stopped by PID."""
    try:
        for p in proxies:
            p.start(wait=False)
        for p in proxies:
            p.ready()
    except BaseException:
        for p in proxies:
            p.stop(signal.SIGKILL)
        raise
    return proxies


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

    def __init__(
        self,
        workdir: Path,
        confdir: Path,
        args: tuple[str, ...] = (),
        *,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        attempts: int = 5,
    ):
        self.workdir, self.confdir, self.args, self.attempts = workdir, confdir, tuple(args), attempts
        self.headless = "--headless" in self.args
        self.log_path = log or workdir / "run.log"
        self.env = {
            "RECEIPT_PROXY_STATE_DIR": str(workdir / "state"),
            "RECEIPT_PROXY_RULES": str(TEST_RULES),
            "RECEIPT_PROXY_METRICS": "127.0.0.1:0",
            **(env or {}),
        }
        self.proc: subprocess.Popen | None = None
        self.proxy_url = self.web_url = self.metrics_url = ""
        self.tries = 0

    def start(self) -> ScriptsRun:
        for attempt in range(1, self.attempts + 1):
            self.tries = attempt
            env = {
                **os.environ,
                **self.env,
                "RECEIPT_PROXY_PORT": "0",
                "RECEIPT_PROXY_WEB_PORT": str(free_port()),
                "PYTHONUNBUFFERED": "1",
            }
            with open(self.log_path, "ab") as out:
                start = out.tell()
                self.proc = subprocess.Popen(
                    [str(ROOT / "scripts" / "run"), *self.args, "--", "--set", f"confdir={self.confdir}"],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.workdir,
                )
            outcome = until_ready(
                self.proc,
                self.log_path,
                lambda start=start: self._ready(start),
                "scripts/run to be ready",
                timeout=2 * READY,
            )
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
            raise AssertionError(
                f"scripts/run exited with {self.proc.returncode} (log: {self.log_path}):\n{tail(self.log_path)}"
            )
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

    def send(
        self,
        client: str,
        method: str,
        url: str,
        body: dict | bytes | None = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float = 10.0,
    ) -> Answer:
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
            r = requests.request(
                method,
                url,
                data=data,
                headers=headers,
                timeout=timeout,
                proxies={"http": self.proxy.url, "https": self.proxy.url},
                verify=str(self.proxy.ca),
            )
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
        env = {
            **os.environ,
            "http_proxy": self.proxy.url,
            "HTTPS_PROXY": self.proxy.url,
            "NO_PROXY": "",
            "no_proxy": "",
        }
        p = subprocess.run([*cmd, url], input=data or b"", capture_output=True, env=env, timeout=timeout + 10)
        if p.returncode != 0:
            return Answer(None, {}, b"", f"curl exit {p.returncode}: {p.stderr.decode(errors='replace').strip()}")
        head, _, body = p.stdout.partition(b"\r\n\r\n")
        while b"connection established" in head.lower().split(b"\r\n")[0]:  # the proxy's CONNECT answer
            head, _, body = body.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        return Answer(int(lines[0].split()[1]), hdrs, body)


SECRETS_HEADERS = {
    "Authorization": SECRETS["authorization"],
    "Cookie": SECRETS["cookie"],
    "api-key": SECRETS["api-key"],
}


CLIENTS = ["requests", "httpx", "curl"]


@contextlib.contextmanager
def next_hop(log: Path, confdir: Path, trusted_ca: Path | None = None) -> Iterator[int]:
    """
    A plain mitmdump as the next proxy of `--mode upstream:http://127.0.0.1:PORT`, yielding its port.
    It intercepts TLS with `confdir`'s CA (the one the proxy under test is told to trust) and trusts
    `trusted_ca` upstream; its log (`log`) lists what went through it. Stopped by its PID.
    """
    port = free_port()
    cmd = [
        str(Path(sys.executable).parent / "mitmdump"),
        "--listen-host",
        "127.0.0.1",
        "-p",
        str(port),
        "--set",
        f"confdir={confdir}",
    ]
    if trusted_ca is not None:
        cmd += ["--set", f"ssl_verify_upstream_trusted_ca={trusted_ca}"]
    with open(log, "wb") as out:
        hop = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)

    def listening() -> bool:
        if hop.poll() is not None:
            raise AssertionError(f"the next proxy exited with {hop.returncode}:\n{tail(log)}")
        return "proxy listening" in log.read_text()

    try:
        until_ready(hop, log, listening, "the next proxy")
        yield port
    finally:
        stop_process(hop)
