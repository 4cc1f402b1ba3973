"""
The soak's mixed load (bench/soak.py runs it): agents' writes, their retries and duplicates, reads and
MCP tool calls, through the fleet (HAProxy in front of two proxies on PostgreSQL) and through the
SQLite proxy, against upstreams that inject the fault matrix's faults (docs/guarantees.md).

Every write is an intent of its own: a bucket of its own in the path (`/api/<bucket>/things`), so
the upstream's count for that path is the intent's effects, and the receipts whose target names the
bucket are its receipts. An intent belongs to one store (the fleet's or the SQLite proxy's): a write
sent to both would rightly be two writes. Its fault is planned on its path before its first send, so
the first attempt meets it and every later one finds an upstream that commits ("ok").

    load = Load(Targets(...), seed=1)
    threads = load.start(workers=6, stop=event)   # and one MCP thread
    ...; stop.set(); load.join(timeout=120)
    load.intents, load.mcp_intents, load.tally   # what was sent, and what the agents got
"""

from __future__ import annotations

import random
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import requests

# The fault matrix's rows (docs/guarantees.md), as the test upstream injects them (tests/upstream.py):
# name -> (upstream fault planned on the path, where the write goes).
FAULTS: dict[str, tuple[str, str]] = {
    "ok": ("ok", "http"),
    "commit-then-drop": ("drop", "http"),
    "commit-then-hang": ("hang", "http"),
    "drop-before-commit": ("lost", "http"),
    "400": ("400", "http"),
    "429": ("429", "http"),
    "500-after-commit": ("500", "http"),
    "half-response": ("half", "http"),
    "late-answer": ("late", "http"),
    "connection-refused": ("", "refused"),
    "tls-handshake-failure": ("", "untrusted"),
    "ok-over-tls": ("ok", "tls"),
    "commit-then-drop-over-tls": ("drop", "tls"),
}
# How often each is drawn: mostly writes that succeed, every fault regularly.
FAULT_WEIGHTS = {"ok": 8, "ok-over-tls": 3}
# Rules of tests/rules_it/test-api.yaml: reconciled by a read, unknown stays blocked, an idempotency key.
OPERATIONS = ("things", "plain", "payments")
# Client timeouts: the matrix's "hang" rows are seen by an agent that gives up after 1 s.
SHORT_TIMEOUT, LONG_TIMEOUT = 1.0, 60.0
# MCP tool-call faults of tests/e2e/mcp/server.py's create_issue ("" commits and answers).
MCP_FAULTS = ("", "", "", "commit_then_drop", "commit_then_hang", "tool_error", "internal_error", "invalid_params")


@dataclass
class Targets:
    """Where the load goes: the proxies' URLs (`fronts`: "fleet" is HAProxy, "sqlite" the SQLite proxy)."""

    fronts: dict[str, str]
    ca: Path  # mitmproxy's CA, which every client trusts
    http: str  # the plain upstream's base URL
    tls: str  # an HTTPS upstream the proxies trust
    untrusted: str  # an HTTPS upstream whose certificate the proxies do not trust
    refused: str  # a port bound but not listening: every connection is refused
    mcp: str  # the MCP server's endpoint (http://127.0.0.1:PORT/mcp)


@dataclass
class Intent:
    n: int
    store: str  # "fleet" or "sqlite"
    fault: str  # a key of FAULTS
    op: str
    bucket: str
    upstream: str  # "http", "tls", "untrusted" or "refused"
    sends: int = 0

    @property
    def path(self) -> str:
        return f"/api/{self.bucket}/{self.op}"

    def body(self) -> dict:
        if self.op == "payments":
            return {"amount": 100 + self.n, "customer": self.bucket}
        return {"title": f"t-{self.bucket}"}


@dataclass
class McpIntent:
    title: str
    store: str
    fault: str
    results: list[str] = field(default_factory=list)


def refusing_port() -> tuple[socket.socket, int]:
    """A loopback port bound and never listened on (connections to it are refused), held while the socket is open."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


class Load:
    """The workers that send the mixed load; thread-safe records of what they sent and got."""

    def __init__(
        self, targets: Targets, upstreams: dict, *, seed: int = 0, pause: float = 0.3, mcp_every: float = 10.0
    ):
        self.t = targets
        self.upstreams = upstreams  # "http" and "tls" -> tests.upstream.Upstream (to plan faults)
        self.rng = random.Random(seed)
        self.pause, self.mcp_every = pause, mcp_every
        self.lock = threading.Lock()
        self.intents: list[Intent] = []
        self.mcp_intents: list[McpIntent] = []
        self.tally: Counter[str] = Counter()  # "<scenario> <store> <answer>" -> n
        self.run = uuid.uuid4().hex[:6]
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()
        self.errors: list[str] = []  # a worker's unexpected exception (the load goes on; the report lists them)

    # --- threads ---------------------------------------------------------------------------

    def start(self, workers: int, stop: threading.Event) -> None:
        self.stop = stop
        for i in range(workers):
            self.threads.append(threading.Thread(target=self._loop, args=(self._scenario, i), daemon=True))
        self.threads.append(threading.Thread(target=self._loop, args=(self._mcp, 0), daemon=True))
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> list[str]:
        """Wait for the workers (each ends its scenario first); the names of those still running after `timeout`."""
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def _loop(self, scenario, i: int) -> None:
        rng = random.Random(f"{self.run}-{scenario.__name__}-{i}")
        while not self.stop.is_set():
            try:
                scenario(rng)
            except Exception as e:  # recorded, never fatal: the soak's checks judge the outcome
                with self.lock:
                    self.errors.append(f"{scenario.__name__}: {type(e).__name__}: {e}")
            self.stop.wait(rng.uniform(0, 2 * (self.mcp_every if scenario == self._mcp else self.pause)))

    def _count(self, key: str) -> None:
        with self.lock:
            self.tally[key] += 1

    # --- HTTP ------------------------------------------------------------------------------

    def _scenario(self, rng: random.Random) -> None:
        kind = rng.choices(("write", "duplicates", "retry-old", "read"), weights=(5, 2, 2, 3))[0]
        if kind == "read":
            return self._read(rng)
        if kind == "retry-old":
            with self.lock:
                old = rng.choice(self.intents) if self.intents else None
            if old is not None:
                self._send(old, "retry-old")
            return None
        intent = self._new_intent(rng)
        if kind == "duplicates":  # identical writes at once: one goes upstream, the others wait, replay or 409
            threads = [threading.Thread(target=self._send, args=(intent, "duplicate")) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=LONG_TIMEOUT + 30)
        else:
            self._send(intent, "write")
        for _ in range(rng.choice((1, 1, 2))):  # the agent's retries, after its answer (or its timeout)
            self.stop.wait(rng.uniform(0.0, 1.5))
            self._send(intent, "retry")
        return None

    def _new_intent(self, rng: random.Random) -> Intent:
        fault = rng.choices(list(FAULTS), weights=[FAULT_WEIGHTS.get(f, 1) for f in FAULTS])[0]
        planned, upstream = FAULTS[fault]
        with self.lock:
            n = len(self.intents) + 1
            intent = Intent(
                n, rng.choice(("fleet", "fleet", "sqlite")), fault, rng.choice(OPERATIONS), f"s{self.run}n{n}", upstream
            )
            self.intents.append(intent)
        if planned and planned != "ok":
            self.upstreams[upstream].plan(intent.path, planned)
        return intent

    def url(self, intent: Intent) -> str:
        base = {"http": self.t.http, "tls": self.t.tls, "untrusted": self.t.untrusted, "refused": self.t.refused}
        return base[intent.upstream] + intent.path

    def _send(self, intent: Intent, scenario: str) -> None:
        with self.lock:
            intent.sends += 1
            first = intent.sends == 1
        short = first and FAULTS[intent.fault][0] in ("hang", "late")
        answer = self._request(
            "POST", self.url(intent), intent.store, json=intent.body(), timeout=SHORT_TIMEOUT if short else LONG_TIMEOUT
        )
        self._count(f"{scenario} {intent.store} {answer}")

    def _read(self, rng: random.Random) -> None:
        with self.lock:
            old = rng.choice(self.intents) if self.intents else None
        if old is None or old.upstream in ("refused", "untrusted"):
            return
        answer = self._request(
            "GET", self.url(old).rsplit("/", 1)[0] + "/things", rng.choice(("fleet", "sqlite")), timeout=LONG_TIMEOUT
        )
        self._count(f"read any {answer}")

    def _request(self, method: str, url: str, store: str, **kwargs) -> str:
        """One request through `store`'s proxy, on a new connection; its answer: "201", "409 replayed", an error."""
        front = self.t.fronts[store]
        try:
            r = requests.request(
                method,
                url,
                proxies={"http": front, "https": front},
                verify=str(self.t.ca),
                headers={"api-key": "soak-agent"},
                **kwargs,
            )
        except requests.RequestException as e:
            return type(e).__name__
        return f"{r.status_code}{' replayed' if r.headers.get('x-receipt-replayed') else ''}"

    # --- MCP -------------------------------------------------------------------------------

    def _mcp(self, rng: random.Random) -> None:
        """One MCP client session (the SDK's client in a subprocess): a tool call with a fault, its retry, a read."""
        from tests.e2e.mcp.client import run_client

        intent = McpIntent(
            f"soak-{self.run}-{uuid.uuid4().hex[:10]}", rng.choice(("fleet", "sqlite")), rng.choice(MCP_FAULTS)
        )
        with self.lock:
            self.mcp_intents.append(intent)
        args = {"title": intent.title, "body": "soak"}
        ops = [
            ("call", "create_issue", {**args, "fault": intent.fault} if intent.fault else args),
            ("call", "create_issue", args),
            ("call", "list_issues", {}),
        ]
        try:
            report = run_client(
                self.t.mcp,
                ops,
                revision=rng.choice(("legacy", "2026-07-28")),
                proxy=self.t.fronts[intent.store],
                ca=self.t.ca,
                timeout=2.0,
            )
        except Exception as e:  # the client process failed or timed out: counted, the checks judge the rest
            self._count(f"mcp {intent.store} {type(e).__name__}")
            return
        for i, res in enumerate(report.get("results", [])[:2]):
            outcome = (
                "ok"
                if res.get("ok") and not res.get("is_error")
                else ("tool-error" if res.get("ok") else f"error {res.get('error', {}).get('code')}")
            )
            intent.results.append(outcome)
            self._count(f"mcp-{'call' if i == 0 else 'retry'} {intent.store} {outcome}")
