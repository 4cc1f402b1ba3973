"""
Text the proxy cannot read as Unicode (issue 24, "Wrong answers"), through a real mitmdump from a
raw-socket client to a real upstream that counts every byte it reads:

- header bytes that are not UTF-8 in a header the proxy reads as text (a Latin-1 byte, an
  encoded lone surrogate `\\ud800`: real clients refuse to send them);
- a JSON `"\\ud800"` escape without its pair in a fingerprinted body field.

Before: the fingerprint could not encode the value, the request was answered `503
receipt_store_unavailable`, counted as a store failure (the alert), though the store was fine.
Now: bad input, answered as bad input: `400 undecodable_header` naming the header (never its
value), or `400 unpaired_surrogate`; nothing sent, no receipt, counted as refused with that
reason. A header the proxy does not read passes to the upstream as it came (which ones it reads:
tests/wire/test_fields.py).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import SECRETS, wait_for
from tests.e2e.processes import Proxy
from tests.e2e.proxy.test_integration import receipts_for
from tests.e2e.proxy.test_local_refusals import Reply, exchange_raw
from tests.mitm.test_metrics_server import by, scrape
from tests.upstream import Upstream

RULES = """\
api: header-api
hosts: [127.0.0.1]
credentials: {header: api-key}
operations:
  notes.create:
    match: {method: POST, path: "/api/{bucket}/notes"}
    fingerprint: {headers: [x-title], body: [title]}
    external_id: id
  charges.create:
    match: {method: POST, path: "/api/{bucket}/charges"}
    fingerprint: {body: [title]}
    external_id: id
    idempotency_key: {header: Idempotency-Key}
"""


CREDENTIAL = SECRETS["api-key"]


@pytest.fixture(scope="module")
def up():
    with Upstream() as u:
        yield u


@pytest.fixture(scope="module")
def header_proxy(tmp_path_factory, confdir):
    """A proxy with these rules, serving metrics on a port the kernel picks."""
    from tests.e2e.processes import METRICS_URL

    work = tmp_path_factory.mktemp("header-proxy")
    rules = work / "rules"
    rules.mkdir()
    (rules / "headers.yaml").write_text(RULES)
    p = Proxy(work, confdir, rules=rules, extra=("--set", "receipts_metrics=127.0.0.1:0")).start()
    p.metrics_url = wait_for(lambda: METRICS_URL.search(p.log()), what="the metrics URL").group(1)
    yield p
    p.stop()


def send(
    proxy: Proxy, up: Upstream, path: str, lines: bytes, credential: bytes | None = None, body: bytes | None = None
) -> Reply:
    body = json.dumps({"title": "café"}).encode() if body is None else body
    credential = f"api-key: {CREDENTIAL}\r\n".encode() if credential is None else credential
    head = (
        f"POST {up.url}{path} HTTP/1.1\r\nHost: 127.0.0.1:{up.port}\r\n".encode()
        + credential
        + lines
        + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
    )
    return exchange_raw(proxy.port, head + body)


def refusals(proxy: Proxy) -> dict[tuple[str, ...], float]:
    return by(scrape(proxy.metrics_url)[1], "receipt_proxy_refused_total", "operation", "reason")


CASES = [
    # (id, the operation's path, the header line(s) sent, the clean line, the header named, bytes never shown)
    pytest.param(
        "notes",
        b"X-Title: caf\xe9-7a1\r\n",
        b"X-Title: caf\xc3\xa9-7a1\r\n",
        "X-Title",
        b"caf\xe9-7a1",
        id="latin-1-in-a-fingerprinted-header",
    ),
    pytest.param(
        "notes",
        b"X-Title: a\xed\xa0\x80b-7a2\r\n",
        b"X-Title: ab-7a2\r\n",
        "X-Title",
        b"\xed\xa0\x80b-7a2",
        id="lone-surrogate-in-a-fingerprinted-header",
    ),
    pytest.param(
        "notes",
        f"api-key: {CREDENTIAL}\xe9\r\n".encode("latin-1"),
        f"api-key: {CREDENTIAL}\r\n".encode(),
        "api-key",
        CREDENTIAL.encode(),
        id="latin-1-in-the-credential",
    ),
    pytest.param(
        "charges",
        b"Idempotency-Key: k\xe9y-7a4\r\n",
        b"Idempotency-Key: key-7a4\r\n",
        "Idempotency-Key",
        b"k\xe9y-7a4",
        id="latin-1-in-the-idempotency-key",
    ),
]


@pytest.mark.parametrize(("operation", "line", "clean", "name", "secret"), CASES)
def test_undecodable_text_in_a_header_the_proxy_reads_gets_400_and_nothing_leaves(
    header_proxy, up, bucket, operation, line, clean, name, secret
):
    path = f"/api/{bucket}/{operation}"
    before, counted = up.received, refusals(header_proxy)
    credential = b"" if name == "api-key" else None  # then the case's line is the credential header itself
    got = send(header_proxy, up, path, line, credential)

    assert got.status == 400, got
    doc = got.json()
    assert (doc["error"], doc["sent"], doc["header"]) == ("undecodable_header", False, name), doc
    assert secret not in got.body and secret.decode("latin-1") not in header_proxy.log()
    assert up.received == before, "the upstream read not one byte"
    assert receipts_for(header_proxy, bucket) == []
    op = f"{operation}.create"
    now = refusals(header_proxy)
    assert now.get((op, "undecodable_header"), 0) == counted.get((op, "undecodable_header"), 0) + 1
    assert now.get((op, "store_unavailable"), 0) == 0, "bad input is not a store failure"
    assert "no receipt could be written" not in header_proxy.log()

    # The same write with the header made UTF-8 goes through, as a first write.
    ok = (
        send(header_proxy, up, path, b"", credential=clean)
        if name == "api-key"
        else send(header_proxy, up, path, clean)
    )
    assert ok.status == 201 and ok.headers["x-receipt-state"] == "succeeded", ok
    assert up.commits(path) == 1


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"title": "a\\ud800b"}', id="lone-high-surrogate"),
        pytest.param(b'{"title": "\\udc00"}', id="lone-low-surrogate"),
        pytest.param(b'{"title": {"nested": "\\ud800"}}', id="in-a-hashed-object"),
    ],
)
def test_an_unpaired_surrogate_in_a_fingerprinted_field_gets_400_and_nothing_leaves(header_proxy, up, bucket, body):
    path = f"/api/{bucket}/charges"
    before, counted = up.received, refusals(header_proxy)
    got = send(header_proxy, up, path, b"", body=body)
    assert got.status == 400, got
    doc = got.json()
    assert (doc["error"], doc["sent"], doc["operation"]) == ("unpaired_surrogate", False, "charges.create"), doc
    assert up.received == before and receipts_for(header_proxy, bucket) == []
    now, key = refusals(header_proxy), ("charges.create", "unpaired_surrogate")
    assert now.get(key, 0) == counted.get(key, 0) + 1
    assert now.get(("charges.create", "store_unavailable"), 0) == 0
    # A pair, escaped, is one character, and a first write.
    ok = send(header_proxy, up, path, b"", body=b'{"title": "\\ud83d\\ude00"}')
    assert ok.status == 201 and ok.headers["x-receipt-state"] == "succeeded", ok


def test_a_header_the_proxy_does_not_read_passes_as_it_came(header_proxy, up, bucket):
    path = f"/api/{bucket}/notes"
    got = send(header_proxy, up, path, b"X-Title: plain\r\nX-Other: caf\xe9\r\n")
    assert got.status == 201 and got.headers["x-receipt-state"] == "succeeded", got
    (seen,) = [r for r in up.requests if r["path"] == path]
    assert seen["headers"]["X-Other"] == "caf\xe9"  # http.server reads header bytes as Latin-1: as sent


def test_a_utf8_header_is_text_the_fingerprint_reads(header_proxy, up, bucket):
    """`é` as UTF-8 is fine: stored as text in the intent, one intent with the same text sent again."""
    path = f"/api/{bucket}/notes"
    first = send(header_proxy, up, path, "X-Title: café\r\n".encode())
    again = send(header_proxy, up, path, "X-Title: café\r\n".encode())
    assert first.status == 201 and again.headers.get("x-receipt-replayed") == "true", (first, again)
    [r] = receipts_for(header_proxy, bucket)
    assert r.intent["headers"] == {"x-title": "café"}
    assert up.commits(path) == 1
