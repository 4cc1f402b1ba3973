"""
The HTTP workloads: the same requests sent directly, through bare mitmdump (the baseline)
and through mitmdump with the receipts addon, timed request by request in rotating order
(direct, baseline, addon; then baseline, addon, direct; ...), so that drift on the
machine lands on every path alike.
"""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import requests
from requests.adapters import HTTPAdapter

ADDONS = ("addon", "compare")  # the receipts addon, and optionally a second build of it (--compare-addon)
UPSTREAM_PATH = "/bench/things"  # the rules file makes POST here a matched write
OTHER_PATH = "/bench/other"  # same host, no rule: passes through
JSON = {"Content-Type": "application/json"}


# --- statistics ---------------------------------------------------------------------------------


def percentile(sorted_ms: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_ms:
        return float("nan")
    k = max(0, min(len(sorted_ms) - 1, round(q / 100 * len(sorted_ms) + 0.5) - 1))
    return sorted_ms[k]


@dataclass
class Stats:
    n: int
    p50: float  # ms
    p99: float  # ms
    mean: float  # ms
    rps: float  # requests per second: sequential, 1000/mean; concurrent, requests / wall time

    @classmethod
    def of(cls, ms: list[float], wall: float | None = None) -> Stats:
        s = sorted(ms)
        mean = sum(s) / len(s)
        rps = len(s) / wall if wall else 1000.0 / mean
        return cls(len(s), percentile(s, 50), percentile(s, 99), mean, rps)


# --- clients ------------------------------------------------------------------------------------


class _NoDelayAdapter(HTTPAdapter):
    """requests with TCP_NODELAY on its proxy connections too (urllib3 turns it off for proxies)."""

    def proxy_manager_for(self, proxy, **proxy_kwargs):
        proxy_kwargs.setdefault("socket_options", [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        return super().proxy_manager_for(proxy, **proxy_kwargs)


Send = Callable[[str, str, bytes | None, dict[str, str]], tuple[int, dict[str, str]]]

CLIENTS = ("httpx", "requests", "requests+nodelay")


def make_client(kind: str, proxy: str | None) -> tuple[Send, Callable[[], None]]:
    """A keep-alive client for one path: (send, close). Proxies are set explicitly; the environment is ignored."""
    if kind == "httpx":
        c = httpx.Client(proxy=proxy, trust_env=False, timeout=30.0)

        def send(method, url, body, headers):
            r = c.request(method, url, content=body, headers=headers)
            return r.status_code, r.headers

        return send, c.close
    if kind in ("requests", "requests+nodelay"):
        s = requests.Session()
        s.trust_env = False
        s.proxies = {"http": proxy, "https": proxy} if proxy else {}
        if kind == "requests+nodelay":
            s.mount("http://", _NoDelayAdapter())

        def send(method, url, body, headers):
            r = s.request(method, url, data=body, headers=headers, timeout=30.0)
            r.content  # noqa: B018  (read the body)
            return r.status_code, r.headers

        return send, s.close
    raise ValueError(kind)


# --- scenarios ----------------------------------------------------------------------------------


@dataclass
class Scenario:
    key: str
    title: str
    method: str
    path: str
    unique: bool  # a new body for every request (a new receipt each time), else a fixed one
    addon_status: int  # what the addon must answer
    addon_check: str = ""  # "succeeded": X-Receipt-State; "replayed": X-Receipt-Replayed
    floor: bool = False  # also time the constant-answer proxy (answers made by an addon)
    setup: str = ""  # "drop": a first attempt the upstream drops; "once": a first attempt that succeeds


SCENARIOS = [
    Scenario("write", "matched POST, new receipt each", "POST", UPSTREAM_PATH, True, 201, "succeeded"),
    Scenario("read", "unmatched GET (same host)", "GET", UPSTREAM_PATH, False, 200),
    Scenario("pass", "unmatched POST (path with no rule)", "POST", OTHER_PATH, True, 201),
    Scenario(
        "blocked",
        "duplicate of an outcome_unknown write: 409",
        "POST",
        UPSTREAM_PATH,
        False,
        409,
        floor=True,
        setup="drop",
    ),
    Scenario(
        "replayed",
        "duplicate of a succeeded write: replay",
        "POST",
        UPSTREAM_PATH,
        False,
        201,
        "replayed",
        floor=True,
        setup="once",
    ),
]


@dataclass
class Path:
    name: str  # direct, baseline, addon, floor, quickack
    proxy: str | None


@dataclass
class HttpBench:
    upstream: str  # http://127.0.0.1:PORT
    paths: dict[str, Path]
    run_id: str
    log: Callable[[str], None] = print
    checks: list[str] = field(default_factory=list)

    @property
    def addons(self) -> list[str]:
        return [p for p in ADDONS if p in self.paths]

    def url(self, path: str, query: str = "") -> str:
        return f"{self.upstream}{path}{query}"

    def body(self, *parts: object) -> bytes:
        return json.dumps({"title": "-".join(str(p) for p in (self.run_id, *parts)), "text": "x" * 64}).encode()

    def upstream_stats(self) -> dict[str, int]:
        with httpx.Client(trust_env=False) as c:
            return c.get(self.url("/__stats")).json()

    # --- sequential, interleaved -------------------------------------------------------------

    def sequential(self, client: str, sc: Scenario, n: int, warmup: int) -> dict[str, Stats]:
        names = ["direct", "baseline", *self.addons] + (["floor"] if sc.floor and "floor" in self.paths else [])
        fixed = self.body(client, sc.key, "dup") if not sc.unique else None
        if sc.setup:
            for p in self.addons:
                self._setup_duplicate(sc, fixed, p)
        clients = {p: make_client(client, self.paths[p].proxy) for p in names}
        before = self.upstream_stats()
        try:
            for i in range(warmup):
                for p in names:
                    self._one(clients[p][0], sc, p, fixed or self.body(client, sc.key, p, "warm", i), client)
            ms: dict[str, list[float]] = {p: [] for p in names}
            gc.collect()
            gc.disable()
            try:
                for i in range(n):
                    k = i % len(names)
                    for p in names[k:] + names[:k]:
                        body = None if sc.method == "GET" else (fixed or self.body(client, sc.key, p, i))
                        ms[p].append(self._one(clients[p][0], sc, p, body, client))
            finally:
                gc.enable()
        finally:
            for _send, close in clients.values():
                close()
        if sc.setup:  # duplicates answered from the record must not reach the upstream
            after = self.upstream_stats()
            for p in self.addons:
                reached = after.get(f"path:{p}", 0) - before.get(f"path:{p}", 0)
                msg = f"{client} {sc.key}: {reached} of {warmup + n} duplicates sent through {p} reached the upstream"
                self.checks.append(msg)
                if reached:
                    raise AssertionError(msg)
        return {p: Stats.of(v) for p, v in ms.items()}

    def _one(self, send: Send, sc: Scenario, path: str, body: bytes | None, client: str) -> float:
        headers = {**JSON, "X-Bench-Path": path}
        t0 = time.perf_counter()
        status, h = send(sc.method, self.url(sc.path), body if sc.method != "GET" else None, headers)
        dt = (time.perf_counter() - t0) * 1000
        addon = path in ADDONS
        want = sc.addon_status if addon else (200 if path == "floor" or sc.method == "GET" else 201)
        ok = status == want
        if ok and addon and sc.addon_check == "succeeded":
            ok = h.get("x-receipt-state") == "succeeded"
        if ok and addon and sc.addon_check == "replayed":
            ok = h.get("x-receipt-replayed") == "true"
        if not ok:
            raise AssertionError(
                f"{client} {sc.key} via {path}: got {status} {dict(h)}, wanted {want} {sc.addon_check}"
            )
        return dt

    def _setup_duplicate(self, sc: Scenario, body: bytes | None, addon: str) -> None:
        """The first attempt, through an addon: dropped by the upstream (outcome_unknown) or answered (succeeded)."""
        with httpx.Client(proxy=self.paths[addon].proxy, trust_env=False, timeout=30.0) as c:
            query = "?fault=drop" if sc.setup == "drop" else ""
            r = c.post(self.url(sc.path, query), content=body, headers={**JSON, "X-Bench-Path": "setup"})
            want = (502, "outcome_unknown") if sc.setup == "drop" else (201, "succeeded")
            if (r.status_code, r.headers.get("x-receipt-state")) != want:
                raise AssertionError(f"{sc.key} setup: got {r.status_code} {r.text[:200]}, wanted {want}")

    # --- the stall: requests through bare mitmdump, with and without the remedies -------------

    def stall(self, n: int, warmup: int) -> dict[str, Stats]:
        """Unmatched POSTs through the baseline and through the quickack script, by requests and httpx."""
        combos = [
            (c, p)
            for p in ("baseline", "quickack")
            if p in self.paths
            for c in ("requests", "requests+nodelay", "httpx")
        ]
        sc = SCENARIOS[2]
        clients = {(c, p): make_client(c, self.paths[p].proxy) for c, p in combos}
        ms: dict[tuple[str, str], list[float]] = {k: [] for k in combos}
        try:
            for i in range(warmup + n):
                k = i % len(combos)
                for combo in combos[k:] + combos[:k]:
                    c, p = combo
                    dt = self._one(clients[combo][0], sc, p, self.body("stall", c, p, i), c)
                    if i >= warmup:
                        ms[combo].append(dt)
        finally:
            for _send, close in clients.values():
                close()
        return {f"{c} via {p}": Stats.of(v) for (c, p), v in ms.items()}

    # --- 64 concurrent clients ------------------------------------------------------------------

    def concurrent(self, clients: int, per_client: int, rounds: int) -> dict[str, Stats]:
        return asyncio.run(self._concurrent(clients, per_client, rounds))

    async def _concurrent(self, nclients: int, per_client: int, rounds: int) -> dict[str, Stats]:
        names = ["direct", "baseline", *self.addons]
        pools = {
            p: [
                httpx.AsyncClient(
                    proxy=self.paths[p].proxy, trust_env=False, timeout=60.0, limits=httpx.Limits(max_connections=1)
                )
                for _ in range(nclients)
            ]
            for p in names
        }
        ms: dict[str, list[float]] = {p: [] for p in names}
        wall = dict.fromkeys(names, 0.0)

        async def worker(c: httpx.AsyncClient, p: str, w: int, r: int, out: list[float] | None) -> None:
            for j in range(per_client):
                body = self.body("conc", p, r, w, j)
                t0 = time.perf_counter()
                resp = await c.post(self.url(UPSTREAM_PATH), content=body, headers={**JSON, "X-Bench-Path": p})
                dt = (time.perf_counter() - t0) * 1000
                if resp.status_code != 201 or (p in ADDONS and resp.headers.get("x-receipt-state") != "succeeded"):
                    raise AssertionError(f"concurrent via {p}: {resp.status_code} {resp.text[:200]}")
                if out is not None:
                    out.append(dt)

        try:
            for p in names:  # warm-up: open every connection
                await asyncio.gather(*(worker(c, p, w, -1, None) for w, c in enumerate(pools[p])))
            for r in range(rounds):
                k = r % len(names)
                for p in names[k:] + names[:k]:
                    t0 = time.perf_counter()
                    await asyncio.gather(*(worker(c, p, w, r, ms[p]) for w, c in enumerate(pools[p])))
                    wall[p] += time.perf_counter() - t0
        finally:
            for p in names:
                for c in pools[p]:
                    await c.aclose()
        return {p: Stats.of(ms[p], wall[p]) for p in names}
