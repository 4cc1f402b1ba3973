"""
Requests our own HTTP client would refuse (issue 17, item 6), through a real mitmdump, from a
raw-socket client (real clients refuse to send these), to a real upstream that counts every
byte it reads (`Upstream.received`).

What mitmproxy does first, seen here: it keeps an obs-fold line in the value as
`first\\r\\n  second` (it neither rejects nor unfolds it: an unmatched request goes upstream
folded), keeps a bare CR, a NUL and a VT, and refuses a header name that is not a token
itself (400, before any hook) unless `validate_inbound_headers` is off.

What the proxy does with a matched write: a header field no client can send gets 400
`bad_header` naming the header (never its value) before any receipt, whoever forwards
(`receipts_forward=addon` or `mitmproxy`); a request head our client refuses to build for
another reason (two Host fields) is recorded `not_sent` with the reason, and answered 502
`not_sent`. Either way the upstream reads zero bytes, and the same write with the header
made clean goes through as a write. Before this change the first kind was forwarded or
recorded `outcome_unknown`, and the second `outcome_unknown`: the clean retry got 409.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass

import pytest

from tests.conftest import SECRETS
from tests.e2e.processes import Proxy
from tests.e2e.proxy.test_integration import events_of as events
from tests.e2e.proxy.test_integration import receipts_for as receipts
from tests.upstream import Upstream

CREDENTIAL = SECRETS["api-key"]  # the rules' credential header; a marker secret the session sweep looks for


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


def exchange_raw(port: int, request: bytes) -> Reply:
    """`request`, byte for byte, on a connection of its own to 127.0.0.1:`port`; the answer, read to the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    raw_head, _, content = data.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return Reply(int(lines[0].split()[1]), headers, content)


@dataclass(frozen=True)
class Case:
    id: str
    line: bytes  # the header line(s) as the agent sends them
    clean: bytes  # the same header, sendable
    name: str  # the header the answer names
    problem: str  # in the answer's detail
    value: bytes  # a part of the value that must never be quoted back or logged


HEADER_CASES = [
    Case(
        "obs-fold",
        b"X-Note: folded-7c1e\r\n  continued-7c1e\r\n",
        b"X-Note: folded-7c1e continued-7c1e\r\n",
        "X-Note",
        "obs-fold",
        b"continued-7c1e",
    ),
    Case(
        "obs-fold-tab",
        b"X-Note: folded-7c1e\r\n\tcontinued-7c1e\r\n",
        b"X-Note: folded-7c1e continued-7c1e\r\n",
        "X-Note",
        "obs-fold",
        b"continued-7c1e",
    ),
    Case(
        "obs-fold-in-the-credential",
        f"api-key: {CREDENTIAL}\r\n more\r\n".encode(),
        f"api-key: {CREDENTIAL}\r\n".encode(),
        "api-key",
        "obs-fold",
        CREDENTIAL.encode(),
    ),
    Case(
        "bare-cr",
        b"X-Note: cr-5a1d\rafter-5a1d\r\n",
        b"X-Note: cr-5a1d after-5a1d\r\n",
        "X-Note",
        "a CR",
        b"after-5a1d",
    ),
    Case(
        "nul",
        b"X-Note: nul-3f0b\x00after-3f0b\r\n",
        b"X-Note: nul-3f0b after-3f0b\r\n",
        "X-Note",
        "a NUL",
        b"after-3f0b",
    ),
    Case(
        "vertical-tab",
        b"X-Note: vt-9e2c\x0bafter-9e2c\r\n",
        b"X-Note: vt-9e2c after-9e2c\r\n",
        "X-Note",
        "VT or FF",
        b"after-9e2c",
    ),
]


@pytest.fixture(scope="module")
def up():
    """This module's own upstream, so that the bytes it reads are this module's requests only."""
    with Upstream() as u:
        yield u


@pytest.fixture(scope="module")
def lax(tmp_path_factory, confdir):
    """A proxy where mitmproxy forwards matched writes itself and does not check header names."""
    p = Proxy(
        tmp_path_factory.mktemp("lax"),
        confdir,
        extra=("--set", "validate_inbound_headers=false", "--set", "receipts_forward=mitmproxy"),
    )
    p.start()
    yield p
    p.stop()


def send_raw(
    proxy: Proxy,
    up: Upstream,
    path: str,
    title: str,
    extra: bytes = b"",
    credential: bytes | None = None,
    method: str = "POST",
) -> Reply:
    """One request on its own connection, byte for byte as given; the answer, read to the close."""
    body = json.dumps({"title": title}).encode() if method == "POST" else b""
    if credential is None:
        credential = f"api-key: {CREDENTIAL}\r\n".encode()
    head = (
        f"{method} {up.url}{path} HTTP/1.1\r\nHost: 127.0.0.1:{up.port}\r\n".encode()
        + credential
        + extra
        + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
    )
    return exchange_raw(proxy.port, head + body)


def assert_clean_retry_is_a_first_write(
    proxy: Proxy, up: Upstream, bucket: str, title: str, extra: bytes = b"", credential: bytes | None = None
) -> None:
    path = f"/api/{bucket}/plain"
    retry = send_raw(proxy, up, path, title, extra, credential)
    assert retry.status == 201, retry
    assert (retry.headers["x-receipt-state"], retry.headers.get("x-receipt-replayed")) == ("succeeded", None)
    assert up.commits(path) == 1
    (r,) = receipts(proxy, bucket)
    assert (r.state, r.retry_of) == ("succeeded", None)


# Each case on both proxies: the refusal comes before the forwarding, whoever forwards.
HEADER_PARAMS = [
    pytest.param(case, which, id=f"{case.id}-{label}")
    for case in HEADER_CASES
    for which, label in (("proxy", "forward-addon"), ("lax", "forward-mitmproxy"))
]


@pytest.mark.parametrize(("case", "which"), HEADER_PARAMS)
def test_a_header_no_client_can_send_gets_400_naming_it_and_nothing_leaves(case, which, request, up, bucket):
    proxy = request.getfixturevalue(which)
    path = f"/api/{bucket}/plain"
    before = up.received
    folds_the_credential = case.name == "api-key"  # then the case's line is the credential header itself
    got = send_raw(proxy, up, path, case.id, case.line, credential=b"" if folds_the_credential else None)

    assert got.status == 400, got
    doc = got.json()
    assert (doc["error"], doc["sent"], doc["header"], doc["operation"]) == (
        "bad_header",
        False,
        case.name,
        "plain.create",
    )
    assert case.problem in doc["detail"], doc
    assert "x-receipt-id" not in got.headers
    assert case.value not in got.body  # the header is named, its value never quoted
    assert case.value.decode("latin-1") not in proxy.log()
    assert up.received == before  # the upstream read not one byte
    assert up.seen(path) == 0
    assert receipts(proxy, bucket) == []  # no receipt: nothing blocks the retry

    if folds_the_credential:
        assert_clean_retry_is_a_first_write(proxy, up, bucket, case.id, credential=case.clean)
    else:
        assert_clean_retry_is_a_first_write(proxy, up, bucket, case.id, case.clean)


@pytest.mark.parametrize(
    ("which", "by"),
    [("proxy", "mitmproxy"), ("lax", "receipt-proxy")],
    ids=["mitmproxy-validates-names", "validate_inbound_headers-off"],
)
def test_a_header_name_that_is_not_a_token_gets_400(which, by, request, up, bucket):
    """mitmproxy refuses it before any hook by default; with its check off, the proxy does, naming it."""
    proxy = request.getfixturevalue(which)
    path = f"/api/{bucket}/plain"
    before = up.received
    got = send_raw(proxy, up, path, "bad name", b"X Note(1): a value\r\n")
    assert got.status == 400, got
    if by == "mitmproxy":
        assert b"invalid header name" in got.body
    else:
        doc = got.json()
        assert (doc["error"], doc["header"], doc["sent"]) == ("bad_header", "X\\x20Note(1)", False)
        assert "not an HTTP token" in doc["detail"]
    assert up.received == before
    assert receipts(proxy, bucket) == []
    assert_clean_retry_is_a_first_write(proxy, up, bucket, "bad name", b"X-Note: a value\r\n")


def test_a_request_our_client_refuses_is_recorded_not_sent_and_its_retry_goes_through(proxy, up, bucket):
    """
    Two Host fields: every field is sendable, but h11 will not build such a head. The refusal
    happens inside the exchange, after the receipt was committed: not_sent, with the reason.
    """
    path = f"/api/{bucket}/plain"
    before = up.received
    second_host = f"Host: 127.0.0.1:{up.port}\r\n".encode()
    got = send_raw(proxy, up, path, "two hosts", second_host)

    assert got.status == 502, got
    doc = got.json()
    assert (doc["error"], doc["state"], got.headers["x-receipt-state"]) == ("not_sent", "not_sent", "not_sent")
    assert up.received == before
    assert up.seen(path) == 0
    (first,) = receipts(proxy, bucket)
    assert first.state == "not_sent" and first.error is not None
    assert "our HTTP client refused the request before writing any of it" in first.error
    assert "multiple Host" in first.error
    assert events(proxy, first.operation_id) == [
        ("transition", None, "submitted"),
        ("transition", "submitted", "not_sent"),
    ]

    retry = send_raw(proxy, up, path, "two hosts")  # the same write, one Host
    assert retry.status == 201, retry
    assert retry.headers["x-receipt-state"] == "succeeded"
    assert up.commits(path) == 1
    first_again, second = receipts(proxy, bucket)
    assert (first_again.state, second.state, second.retry_of) == ("not_sent", "succeeded", first.operation_id)


def test_mitmproxy_passes_an_obs_fold_through_to_the_hooks_as_it_came(proxy, up, bucket):
    """
    What mitmproxy itself does with an obs-fold line: it neither refuses nor unfolds it. An
    unmatched request (a read: no rule, no receipt) goes upstream with the line still folded.
    """
    path = f"/api/{bucket}/plain"
    got = send_raw(proxy, up, path, "", b"X-Note: folded\r\n  continued\r\n", method="GET")
    assert got.status == 200, got
    (seen,) = [r for r in up.requests if r["method"] == "GET" and r["path"].startswith(path)]
    assert seen["headers"]["X-Note"] == "folded\r\n continued"  # mitmproxy's join: CRLF and one space
    assert receipts(proxy, bucket) == []
