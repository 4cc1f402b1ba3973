"""
No caller is ever answered with another caller's recorded answer, through a real mitmdump:
callers that differ only by a key in the query, a client_secret in the body, a bot token in the
path or a header the rule does not name each get their own write; a wrong client_secret never
gets the real access token; and a token in a path is stored, logged and shown nowhere (the DB
and its WAL, the proxy's log, `receipts export`, `list --json`, `show`, `rules explain`).
Without a proxy: tests/intent/test_caller.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import requests

from tests.conftest import ROOT, SECRETS, read
from tests.e2e.processes import Proxy

RECEIPTS = ROOT / ".venv" / "bin" / "receipts"

# The rules as a user writes them without declaring anything: what looks like a credential counts.
FOUND = """\
api: found
hosts: [127.0.0.1]
credentials: {header: api-key}
operations:
  things.create:
    match: {method: POST, path: "/f/{bucket}/things"}
    fingerprint: {body: [title]}
  token.create:
    match: {method: POST, path: "/f/{bucket}/oauth/token"}
    fingerprint: {body: [grant_type, client_id]}
  bot.send:  # the token is the bot's key, not the message: the fingerprint leaves it out
    match: {method: POST, path: "/f/{bucket}/bot{token}/sendMessage"}
    fingerprint: {path: [bucket], body: [chat_id, text]}
  hook.post:
    match: {method: POST, path: "/f/{bucket}/api/webhooks/{id}/{webhook_token}"}
    fingerprint: {path: [bucket, id], body: [content]}
"""

# Credentials no name or shape reveals, declared.
DECLARED = """\
api: declared
hosts: [127.0.0.1]
credentials: {query: [k]}
operations:
  rooms.send:
    credentials: {path: [room]}
    match: {method: POST, path: "/d/{bucket}/rooms/{room}/send"}
    fingerprint: {body: [text]}
"""

TG_A = "111111111:AAbot-one-token_abcdefghijklmnopqrstuvwx"
TG_B = "222222222:AAbot-two-token_abcdefghijklmnopqrstuvwx"
MARKER_TG = SECRETS["path_token"]  # in no DB, WAL or log of the whole run (conftest's sweep)
MARKER_ROOM = SECRETS["path_room"]


@pytest.fixture(scope="module")
def found(tmp_path_factory, confdir) -> Iterator[Proxy]:
    yield from _proxy(tmp_path_factory, confdir, "found", FOUND)


@pytest.fixture(scope="module")
def declared(tmp_path_factory, confdir) -> Iterator[Proxy]:
    yield from _proxy(tmp_path_factory, confdir, "declared", DECLARED)


def _proxy(tmp_path_factory, confdir, name: str, rules: str) -> Iterator[Proxy]:
    work = tmp_path_factory.mktemp(f"callers-{name}")
    (work / "rules").mkdir()
    (work / "rules" / f"{name}.yaml").write_text(rules)
    p = Proxy(work, confdir, rules=work / "rules")
    try:
        p.start()
        yield p
    finally:
        p.stop()


def send(proxy: Proxy, url: str, *, body: bytes = b"{}", headers: dict[str, str] | None = None) -> requests.Response:
    """A write from an agent with no credential header at all (the case the rule cannot see)."""
    return requests.post(
        url,
        data=body,
        headers={"Content-Type": "application/json", **(headers or {})},
        proxies={"http": proxy.url},
        timeout=20,
    )


JSON_BODY = json.dumps({"title": "one", "chat_id": 42, "text": "hello", "content": "hello"}).encode()
FORM = {"Content-Type": "application/x-www-form-urlencoded"}

# id, proxy, the path after /<prefix>/<bucket>, and caller A's and caller B's (url suffix, headers, body)
CALLERS = [
    ("query-key", "found", "/things", ("?api_key=KEY-A", {}, JSON_BODY), ("?api_key=KEY-B", {}, JSON_BODY)),
    (
        "unnamed-header",
        "found",
        "/things",
        ("", {"X-Api-Key": "KEY-A"}, JSON_BODY),
        ("", {"X-Api-Key": "KEY-B"}, JSON_BODY),
    ),
    (
        "form-client_secret",
        "found",
        "/oauth/token",
        ("", FORM, b"grant_type=client_credentials&client_id=c1&client_secret=SECRET-A"),
        ("", FORM, b"grant_type=client_credentials&client_id=c1&client_secret=SECRET-B"),
    ),
    (
        "json-client_secret",
        "found",
        "/oauth/token",
        ("", {}, b'{"grant_type": "client_credentials", "client_id": "c1", "client_secret": "SECRET-A"}'),
        ("", {}, b'{"grant_type": "client_credentials", "client_id": "c1", "client_secret": "SECRET-B"}'),
    ),
    (
        "telegram-bot-token",
        "found",
        "",
        (f"/bot{TG_A}/sendMessage", {}, JSON_BODY),
        (f"/bot{TG_B}/sendMessage", {}, JSON_BODY),
    ),
    ("discord-webhook-token", "found", "/api/webhooks/77", ("/tokA", {}, JSON_BODY), ("/tokB", {}, JSON_BODY)),
    ("declared-query", "declared", "/rooms/r1/send", ("?k=A", {}, JSON_BODY), ("?k=B", {}, JSON_BODY)),
    ("declared-path", "declared", "/rooms", ("/room-A/send", {}, JSON_BODY), ("/room-B/send", {}, JSON_BODY)),
]


@pytest.mark.parametrize("where, path, a, b", [pytest.param(*c[1:], id=c[0]) for c in CALLERS])
def test_two_callers_that_differ_only_by_a_credential_each_get_their_own_write(request, upstream, where, path, a, b):
    proxy: Proxy = request.getfixturevalue(where)
    bucket = f"b{uuid.uuid4().hex[:12]}"
    base = f"{upstream.url}/{where[0]}/{bucket}{path}"
    paths = {f"/{where[0]}/{bucket}{path}{s.split('?')[0]}" for s in (a[0], b[0])}

    def writes() -> int:
        return sum(upstream.seen(p) for p in paths)

    first = send(proxy, base + a[0], headers=a[1], body=a[2])
    assert first.status_code == 201 and "x-receipt-replayed" not in first.headers
    other = send(proxy, base + b[0], headers=b[1], body=b[2])
    assert other.status_code == 201, other.text
    assert "x-receipt-replayed" not in other.headers  # never the first caller's answer
    assert other.json()["id"] != first.json()["id"] or len(paths) == 2  # its own effect upstream
    assert writes() == 2
    again = send(proxy, base + a[0], headers=a[1], body=a[2])  # the first caller's retry: still one write
    assert again.headers.get("x-receipt-replayed") == "true" and again.json() == first.json()
    assert writes() == 2


class FakeApi:
    """
    A small API on 127.0.0.1 that answers without echoing the request (as Telegram and Discord do):
    `POST .../oauth/token` gives an access token to the right client_secret and 401 to another;
    any other POST is a write, counted per path (`writes`), answered `{"ok": true, "message_id": n}`.
    """

    RIGHT = "the-right-secret"

    def __init__(self) -> None:
        self.tokens: list[dict] = []  # the token requests, as forms
        self.writes: dict[str, int] = {}
        self.issued = 0
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                doc: dict[str, object]  # the JSON answer
                with api.lock:
                    if self.path.endswith("/oauth/token"):
                        form = parse_qs(body.decode())
                        api.tokens.append(form)
                        if form.get("client_secret") == [api.RIGHT]:
                            api.issued += 1
                            status, doc = (
                                200,
                                {"access_token": f"REAL-ACCESS-TOKEN-{api.issued}", "token_type": "bearer"},
                            )
                        else:
                            status, doc = 401, {"error": "invalid_client"}
                    else:
                        path = self.path.split("?")[0]
                        api.writes[path] = api.writes.get(path, 0) + 1
                        status, doc = 200, {"ok": True, "message_id": sum(api.writes.values())}
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}"

    def __enter__(self) -> FakeApi:
        threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.http.shutdown()
        self.http.server_close()


def test_a_wrong_client_secret_is_never_replayed_the_real_token(found):
    with FakeApi() as oauth:
        url = f"{oauth.url}/f/b{uuid.uuid4().hex[:12]}/oauth/token"
        form = "grant_type=client_credentials&client_id=app-1&client_secret={}"
        right = send(found, url, headers=FORM, body=form.format(FakeApi.RIGHT).encode())
        assert right.status_code == 200 and right.json()["access_token"] == "REAL-ACCESS-TOKEN-1"
        wrong = send(found, url, headers=FORM, body=form.format("a-wrong-guess").encode())
        assert wrong.status_code == 401 and "REAL-ACCESS-TOKEN" not in wrong.text
        assert "x-receipt-replayed" not in wrong.headers
        assert len(oauth.tokens) == 2  # the wrong secret went to the API, which refused it
        again = send(found, url, headers=FORM, body=form.format(FakeApi.RIGHT).encode())
        assert again.headers.get("x-receipt-replayed") == "true"  # the right caller's own retry: its answer
        assert again.json()["access_token"] == "REAL-ACCESS-TOKEN-1" and len(oauth.tokens) == 2


def test_a_caller_that_cannot_be_told_apart_is_never_replayed(found, upstream):
    """Only a signature, which changes between callers and is not a credential to count: the same
    bytes are blocked (409, no replay); another signature is another write."""
    bucket = f"b{uuid.uuid4().hex[:12]}"
    url = f"{upstream.url}/f/{bucket}/things"
    first = send(found, url + "?sig=SIG-ONE", body=JSON_BODY)
    assert first.status_code == 201
    same = send(found, url + "?sig=SIG-ONE", body=JSON_BODY)
    assert same.status_code == 409 and same.json()["error"] == "duplicate_succeeded"
    assert "x-receipt-replayed" not in same.headers
    other = send(found, url + "?sig=SIG-TWO", body=JSON_BODY)
    assert other.status_code == 201 and "x-receipt-replayed" not in other.headers
    assert upstream.seen(f"/f/{bucket}/things") == 2
    assert "no credential tells this caller apart (only query:sig" in found.log()


def receipts(proxy: Proxy, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("RECEIPT_PROXY_DB", "RECEIPT_PROXY_STATE_DIR")}
    p = subprocess.run(
        [str(RECEIPTS), "--db", str(proxy.db), *args], capture_output=True, text=True, timeout=60, env=env
    )
    assert p.returncode == 0, p.stderr
    return p.stdout + p.stderr


def test_a_token_in_the_path_is_stored_logged_and_shown_nowhere(found):
    bucket = f"b{uuid.uuid4().hex[:12]}"
    with FakeApi() as api:
        tg = f"{api.url}/f/{bucket}/bot{MARKER_TG}/sendMessage"
        hook = f"{api.url}/f/{bucket}/api/webhooks/77/{MARKER_ROOM}"
        spelled = f"{api.url}/f/{bucket}//bot{MARKER_TG.replace(':', '%3A')}/sendMessage"  # raw_target differs
        for url in (tg, hook):
            assert send(found, url, body=JSON_BODY).status_code == 200
        assert send(found, spelled, body=JSON_BODY).headers.get("x-receipt-replayed") == "true"
        assert sum(api.writes.values()) == 2
    text = shown_everywhere(found, bucket, [tg, hook, spelled])
    assert f"/f/{bucket}/REDACTED/sendMessage" in text and "/api/webhooks/77/REDACTED" in text
    assert f"/f/{bucket}/REDACTED/sendMessage" in found.log()  # the proxy's own line names the target, redacted


def test_a_declared_path_credential_is_stored_logged_and_shown_nowhere(declared):
    bucket = f"b{uuid.uuid4().hex[:12]}"
    with FakeApi() as api:
        room = f"{api.url}/d/{bucket}/rooms/{MARKER_ROOM}/send?k=K"
        assert send(declared, room, body=JSON_BODY).status_code == 200
        assert send(declared, room, body=JSON_BODY).headers.get("x-receipt-replayed") == "true"
        assert sum(api.writes.values()) == 1
    text = shown_everywhere(declared, bucket, [room])
    assert f"/d/{bucket}/rooms/REDACTED/send" in text


def shown_everywhere(proxy: Proxy, bucket: str, urls: list[str]) -> str:
    """What the receipts of `bucket` show (export, list --json, show, rules explain of `urls`), once it is
    checked that no path marker is in the proxy's DB, WAL or log, nor in any of it."""
    exported = receipts(proxy, "export")
    ids = [json.loads(line)["operation_id"] for line in exported.splitlines() if bucket in line]
    assert ids
    shown = [exported, receipts(proxy, "list", "--json"), *(receipts(proxy, "show", i) for i in ids)]
    for url in urls:
        shown.append(receipts(proxy, "rules", "explain", "POST", url, "--rules", str(proxy.rules), "--json"))
        shown.append(receipts(proxy, "rules", "explain", "POST", url, "--rules", str(proxy.rules)))
    files = [Path(proxy.db), Path(f"{proxy.db}-wal"), Path(f"{proxy.db}-shm"), proxy.log_path]
    markers = (MARKER_TG, MARKER_TG.split(":")[1], MARKER_ROOM)
    assert [m for m in markers for f in files if m.encode() in read(f)] == []
    text = "\n".join(shown)
    assert [m for m in markers if m in text] == []
    return text
