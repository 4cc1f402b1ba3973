"""
Test harness for the shipped rules packs (rules/*.yaml): a fake API on 127.0.0.1 that
answers with the shapes an API's documentation shows, and a real mitmdump with the pack.

    def test_slack_internal_error_is_unknown(slack):            # slack = PackRun (see pack_run)
        slack.api.on("POST", "/api/chat.postMessage", 200, {"ok": False, "error": "internal_error"})
        r = slack.send("POST", "/api/chat.postMessage", json={"channel": "C1", "text": "hi"})
        assert r.headers["x-receipt-state"] == "outcome_unknown"
        assert slack.api.count("POST", "/api/chat.postMessage") == 1
        assert slack.receipt(r).state is State.OUTCOME_UNKNOWN

The pack is copied with its hosts pointed at the fake: every host in `hosts:` becomes
`127.0.0.1:<port>`, and every `https://<host>` in the file (absolute reconcile URLs)
becomes `http://127.0.0.1:<port>`. Nothing else of the pack changes, and the real API is
never contacted. Requests are sent with httpx through the proxy (trust_env off).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from proxy_addon.rules import load_rules
from proxy_addon.states import State
from proxy_addon.store import Receipt, Store
from tests.conftest import ROOT
from tests.e2e.processes import Proxy

PACKS = ROOT / "rules"

Answer = tuple[int, dict[str, str], Any]  # status, headers, body (dict/list → JSON, str/bytes as is)


@dataclass
class Seen:
    """A request the fake API received."""

    method: str
    path: str  # with the query string
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def path_match(self, pattern: re.Pattern[str]) -> re.Match[str]:
        """`pattern`'s match of the path without its query: of the route that sent the request here."""
        m = pattern.fullmatch(self.path.split("?")[0])
        assert m is not None, f"{self.path} is not a path of {pattern.pattern}"
        return m


@dataclass
class _Route:
    method: str
    path: re.Pattern[str]
    answer: Answer | Callable[[Seen], Answer]
    times: int | None  # None: every time


class FakeAPI:
    """
    A programmable HTTP/1.1 server standing in for a real API.

    `on(method, path, status, body, headers=None, times=None)` answers requests whose path
    (without the query) fully matches the regex `path`; the newest route wins, and a route
    with `times=1` answers once and is then forgotten. `body` may be a callable taking the
    `Seen` request and returning (status, headers, body). No route → 404 {"error": "no route"}.
    `drop(method, path)`: the next such request is read, then the connection is closed
    without an answer (the outcome is unknown to the proxy).
    """

    def __init__(self) -> None:
        self.routes: list[_Route] = []
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    def on(
        self,
        method: str,
        path: str,
        status: int | Callable[[Seen], Answer],
        body: Any = None,
        headers: dict[str, str] | None = None,
        times: int | None = None,
    ) -> None:
        answer = status if callable(status) else (status, headers or {}, body)
        with self.lock:
            self.routes.append(_Route(method.upper(), re.compile(path), answer, times))

    def drop(self, method: str, path: str) -> None:
        self.on(method, path, 0, None, times=1)

    def count(self, method: str, path: str) -> int:
        """How many requests with this method and exact path (query ignored) arrived."""
        with self.lock:
            return sum(1 for s in self.seen if s.method == method and s.path.split("?")[0] == path)

    def requests(self, method: str | None = None) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if method is None or s.method == method]

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.server_address[1]

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _answer(self, seen: Seen) -> Answer:
        with self.lock:
            self.seen.append(seen)
            for route in reversed(self.routes):
                if route.method == seen.method and route.path.fullmatch(seen.path.split("?")[0]):
                    if route.times is not None:
                        route.times -= 1
                        if route.times <= 0:
                            self.routes.remove(route)
                    break
            else:
                return 404, {}, {"error": "no route"}
        answer = route.answer
        return answer(seen) if callable(answer) else answer

    def __enter__(self) -> FakeAPI:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                status, headers, payload = fake._answer(seen)
                if status == 0:  # drop: read, never answer
                    self.close_connection = True
                    self.connection.close()
                    return
                if isinstance(payload, (dict, list)):
                    data = json.dumps(payload).encode()
                    headers = {"Content-Type": "application/json", **headers}
                elif isinstance(payload, str):
                    data = payload.encode()
                else:
                    data = payload or b""
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()


def ours(resp: Any) -> dict[str, Any]:
    """
    The proxy's own answer (error, operation_id, state, hint...) in a response it gave in place of
    the API: under `receipt_proxy` when the pack names the API's error envelope (`errors:`), in the
    error object where the envelope has one; the body itself when it is plain.
    """
    doc = resp.json()
    inner = doc.get("error") if isinstance(doc.get("error"), dict) else doc
    return inner.get("receipt_proxy", doc)


def pointed_at(pack: Path, origin_port: int) -> str:
    """The pack's text with its hosts (and absolute https:// URLs to them) pointed at 127.0.0.1:port."""
    text = pack.read_text()
    rf = load_rules(text, str(pack))
    for host in rf.hosts:
        text = text.replace(f"https://{host}", f"http://127.0.0.1:{origin_port}")
    hosts_line = re.compile(r"^hosts:.*$", re.MULTILINE)
    assert hosts_line.search(text), f"{pack}: expected a one-line 'hosts: [...]'"
    return hosts_line.sub(f"hosts: ['127.0.0.1:{origin_port}']", text, count=1)


@dataclass
class PackRun:
    """A proxy running one pack in front of its fake API."""

    api: FakeAPI
    proxy: Proxy
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request (credentials)

    def send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: Any = None,
        files: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 10.0,
    ) -> httpx.Response:
        """One request through the proxy to the fake API; `path` is relative to the API's origin."""
        with httpx.Client(proxy=self.proxy.url, trust_env=False, timeout=timeout) as c:
            return c.request(
                method,
                self.api.origin + path,
                json=json,
                data=data,
                files=files,
                content=content,
                headers={**self.headers, **(headers or {})},
            )

    def store(self) -> Store:
        return Store.open(self.proxy.db, create=False)

    def receipt(self, answer: httpx.Response | str) -> Receipt:
        """The receipt behind an answer (its X-Receipt-Id header) or an id."""
        operation_id = answer if isinstance(answer, str) else answer.headers["x-receipt-id"]
        store = self.store()
        try:
            return store.get(operation_id)
        finally:
            store.close()

    def reasons(self, answer: httpx.Response | str) -> list[str]:
        operation_id = answer if isinstance(answer, str) else answer.headers["x-receipt-id"]
        store = self.store()
        try:
            return [e.reason for e in store.events(operation_id)]
        finally:
            store.close()

    def history(self, answer: httpx.Response | str) -> list[tuple[str | None, str, str]]:
        """(from, to, reason) of every state change of the receipt behind an answer (or id);
        duplicates blocked or replayed are events too, but not state changes."""
        operation_id = answer if isinstance(answer, str) else answer.headers["x-receipt-id"]
        store = self.store()
        try:
            return [
                (e.from_state and str(e.from_state), str(e.to_state), e.reason)
                for e in store.events(operation_id)
                if e.event == "transition"
            ]
        finally:
            store.close()

    def states(self, answer: httpx.Response | str) -> list[State]:
        """The states the receipt went through, in order (its transitions)."""
        return [State(to) for _, to, _ in self.history(answer)]

    def receipt_count(self) -> int:
        store = self.store()
        try:
            return sum(store.counts().values())
        finally:
            store.close()


def pack_run(
    pack: str, workdir: Path, confdir: Path, *, headers: dict[str, str] | None = None, extra: tuple[str, ...] = ()
):
    """
    A generator for a module-scoped fixture: the fake API, then the proxy with `rules/<pack>`
    pointed at it.

        @pytest.fixture(scope="module")
        def slack(tmp_path_factory, confdir):
            yield from pack_run("slack.yaml", tmp_path_factory.mktemp("slack"), confdir,
                                headers={"Authorization": "Bearer xoxb-test"})
    """
    with FakeAPI() as api:
        rules = workdir / "rules"
        rules.mkdir()
        (rules / pack).write_text(pointed_at(PACKS / pack, api.port))
        proxy = Proxy(
            workdir,
            confdir,
            rules=rules,
            extra=("--set", "receipts_wait_submitted=0", "--set", "receipts_read_timeout=5", *extra),
        )
        try:
            proxy.start()  # inside: a start that fails stops its process too (Proxy.ready), and so does this
            yield PackRun(api, proxy, dict(headers or {}))
        finally:
            proxy.stop()


__all__ = ["PACKS", "FakeAPI", "PackRun", "Seen", "State", "ours", "pack_run", "pointed_at"]
