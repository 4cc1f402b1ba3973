"""
Equivalent encodings of one body are one write, through a real proxy, in front of an upstream
that decodes request bodies (tests/upstream.py DecodingUpstream) as frameworks with a
decompression middleware do: had the proxy forwarded a second encoding, the upstream would
have created the item twice.

- The same JSON sent plain, as `gzip -n`, as `gzip -n -1`, deflated, as br, as zstd and as
  `gzip, br` is ONE write: the first is forwarded, every later one is replayed.
- `café` composed (NFC) and decomposed (NFD) is one write.
- A JSON body sent by `curl -d` (the form content type) is read as JSON, one write with the
  same body sent as application/json, and the receipt, the log and the Receipt view say
  which fallback was used.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import unicodedata
import zlib

import brotli
import pytest

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

from proxy_addon.store import Store
from tests.conftest import SECRETS, wait_for
from tests.e2e.processes import SECRETS_HEADERS, Clients
from tests.upstream import DecodingUpstream


@pytest.fixture(scope="module")
def decoding_upstream():
    with DecodingUpstream() as up:
        yield up


def receipts(proxy, path: str) -> list:
    store = Store.open(proxy.db, create=False)
    try:
        return sorted((r for r in store.list(limit=None) if path in r.target), key=lambda r: r.submitted_at)
    finally:
        store.close()


def settled(proxy, path: str) -> list:
    return wait_for(
        lambda: [r for r in receipts(proxy, path) if r.state not in ("submitted", "awaiting_approval")],
        what=f"the receipts of {path} to settle",
    )


def gzip_tool(data: bytes, *flags: str) -> bytes:
    """The gzip program itself, as the issue measured it (`gzip -n`, `gzip -n -1`)."""
    return subprocess.run(["gzip", "-n", "-c", *flags], input=data, capture_output=True, check=True).stdout


ENCODINGS = {
    "gzip -n": ("gzip", lambda d: gzip_tool(d)),
    "gzip -n -1": ("gzip", lambda d: gzip_tool(d, "-1")),
    "deflate": ("deflate", zlib.compress),
    "br": ("br", brotli.compress),
    "zstd": ("zstd", zstd.compress),
    "gzip, br": ("gzip, br", lambda d: brotli.compress(gzip.compress(d))),
}


@pytest.mark.parametrize("first", ["plain", "gzip -n"])
def test_the_same_body_in_every_encoding_is_one_write(first, proxy, decoding_upstream, bucket):
    up, clients = decoding_upstream, Clients(proxy)
    path = f"/api/{bucket}/things"
    doc = {"title": f"encoded {bucket}", "n": 1}
    plain = json.dumps(doc).encode()

    def send(name: str, client: str):
        if name == "plain":
            return clients.send(client, "POST", up.url + path, plain)
        coding, encode = ENCODINGS[name]
        return clients.send(client, "POST", up.url + path, encode(plain), headers={"Content-Encoding": coding})

    order = [first] + [n for n in ["plain", *ENCODINGS] if n != first]
    answers = [send(name, ("requests", "curl", "httpx")[i % 3]) for i, name in enumerate(order)]
    assert answers[0].status == 201, answers[0]
    assert up.commits(path) == 1  # one write, whatever the encoding
    assert up.items[path] == [{**doc, "id": 1}]  # the upstream read the decoded JSON
    (r,) = settled(proxy, path)
    assert r.state == "succeeded"
    assert r.intent["body"] == {"title": doc["title"]}  # fields, not the hash of compressed bytes
    for name, a in zip(order[1:], answers[1:], strict=True):
        assert (a.status, a.headers.get("x-receipt-replayed"), a.headers.get("x-receipt-id")) == (
            201,
            "true",
            r.operation_id,
        ), f"{name}: {a}"
        assert a.json() == answers[0].json()
    assert up.seen(path) == 1


def test_nfc_and_nfd_are_one_write(proxy, decoding_upstream, bucket):
    up, clients = decoding_upstream, Clients(proxy)
    path = f"/api/{bucket}/things"
    title = f"Tasse à café {bucket}"
    nfc, nfd = unicodedata.normalize("NFC", title), unicodedata.normalize("NFD", title)
    assert nfc != nfd
    first = clients.send("requests", "POST", up.url + path, json.dumps({"title": nfc}, ensure_ascii=False).encode())
    second = clients.send("curl", "POST", up.url + path, json.dumps({"title": nfd}, ensure_ascii=False).encode())
    escaped = clients.send("httpx", "POST", up.url + path, json.dumps({"title": nfd}).encode())  # \\u0301 escapes
    assert first.status == 201, first
    assert [(a.status, a.headers.get("x-receipt-replayed")) for a in (second, escaped)] == [(201, "true")] * 2
    assert up.commits(path) == 1
    (r,) = settled(proxy, path)
    assert r.intent["body"]["title"] == nfc


def curl_d(proxy, url: str, body: str) -> subprocess.CompletedProcess:
    """`curl -d`, as a person types it: the form content type, whatever the body is."""
    env = {**os.environ, "http_proxy": proxy.url, "NO_PROXY": "", "no_proxy": ""}
    headers = [x for k, v in SECRETS_HEADERS.items() for x in ("-H", f"{k}: {v}")]
    return subprocess.run(
        ["curl", "-sS", "-D", "-", "--max-time", "10", *headers, "-d", body, f"{url}?token={SECRETS['token']}"],
        capture_output=True,
        env=env,
        timeout=20,
    )


def test_curl_d_json_is_read_as_json_and_its_fallback_is_reported(proxy, decoding_upstream, bucket):
    from proxy_addon.mitm.web import describe

    up = decoding_upstream
    path = f"/api/{bucket}/things"
    doc = {"title": f"curl -d {bucket}", "body": "a=b&c=d"}  # '=' and '&': it even parses as a form
    out = curl_d(proxy, up.url + path, json.dumps(doc))
    assert out.returncode == 0 and b" 201 " in out.stdout.split(b"\r\n")[0], out
    assert up.requests[-1]["headers"]["Content-Type"] == "application/x-www-form-urlencoded"
    (r,) = settled(proxy, path)
    assert r.intent["body"] == {"title": doc["title"]}
    assert r.intent["fallback"] == "json_sent_as_form"
    # said in the log (one line, no values) and in the Receipt view
    line = wait_for(
        lambda: [x for x in proxy.log().splitlines() if "json_sent_as_form" in x and path in x],
        what="the fallback's log line",
    )
    assert len(line) == 1 and doc["title"] not in line[0] and SECRETS["token"] not in line[0]
    store = Store.open(proxy.db, create=False)
    try:
        view = describe(store, r.operation_id)
    finally:
        store.close()
    assert "fallback json_sent_as_form" in view and "curl -d" in view
    # The same JSON declared as JSON is the same write.
    again = Clients(proxy).send("httpx", "POST", up.url + path, json.dumps(doc).encode())
    assert (again.status, again.headers.get("x-receipt-replayed")) == (201, "true"), again
    assert up.commits(path) == 1
