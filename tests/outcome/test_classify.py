"""Unit tests for proxy_addon.outcome.classify: response statuses, upstream errors, external ids."""

from __future__ import annotations

import functools
import json

import pytest

from proxy_addon.outcome.classify import answer_outcome, classify_error, classify_status, external_id_of
from proxy_addon.rules import ALREADY_EXISTS, RuleSet, load_rules
from proxy_addon.states import State

S, R, U, N = State.SUCCEEDED, State.REJECTED, State.OUTCOME_UNKNOWN, State.NOT_SENT

RULES = """\
api: shop
hosts: [api.shop.test]
operations:
  plain:
    match: {{method: POST, path: /v1/plain}}
  overridden:
    match: {{method: POST, path: /v1/overridden}}
    classify: {classify}
  exact-2xx:
    match: {{method: POST, path: /v1/exact}}
    classify: {{202: outcome_unknown}}
"""


@functools.cache
def op(path: str, classify: str = "{409: succeeded, 4xx: outcome_unknown}"):
    rs = RuleSet.of([load_rules(RULES.format(classify=classify), "t.yaml")])
    m = rs.match("api.shop.test", 443, "POST", path)
    assert m is not None
    return m.operation


DEFAULTS = [
    (200, S),
    (201, S),
    (202, S),
    (204, S),
    (301, S),
    (302, S),
    (304, S),
    (400, R),
    (401, R),
    (403, R),
    (404, R),
    (410, R),
    (422, R),
    (429, R),
    (499, R),  # refused before executing
    (408, U),
    (409, ALREADY_EXISTS),  # maybe executed: the conflict may be with this very effect; a read decides
    (500, U),
    (502, U),
    (503, U),
    (504, U),
    (599, U),
]


@pytest.mark.parametrize("status, expected", [pytest.param(s, e, id=str(s)) for s, e in DEFAULTS])
@pytest.mark.parametrize("with_op", [pytest.param(False, id="no-op"), pytest.param(True, id="op-without-overrides")])
def test_classify_status_default(status, expected, with_op):
    assert classify_status(status, op("/v1/plain") if with_op else None) is expected


OVERRIDES = [
    (409, S),  # exact code beats its class
    (404, U),
    (400, U),
    (401, U),
    (422, U),
    (429, U),
    (408, U),  # the 4xx class override
    (200, S),
    (201, S),
    (304, S),  # no override: default
    (500, U),
    (502, U),
    (503, U),  # no override: default
]


@pytest.mark.parametrize("status, expected", [pytest.param(s, e, id=str(s)) for s, e in OVERRIDES])
@pytest.mark.parametrize(
    "classify",
    [
        pytest.param("{409: succeeded, 4xx: outcome_unknown}", id="exact-first"),
        pytest.param("{4xx: outcome_unknown, 409: succeeded}", id="class-first"),
        pytest.param("{4XX: outcome_unknown, '409': succeeded}", id="upper-case-class"),
    ],
)
def test_classify_status_per_operation_overrides(status, expected, classify):
    assert classify_status(status, op("/v1/overridden", classify)) is expected


@pytest.mark.parametrize(
    "status, expected",
    [
        pytest.param(202, U, id="202-overridden"),
        pytest.param(201, S, id="201-default"),
        pytest.param(404, R, id="404-default"),
    ],
)
def test_classify_status_exact_override_only_hits_its_code(status, expected):
    assert classify_status(status, op("/v1/exact")) is expected


ERRORS = [
    # id, message, tcp_setup, tls, tls_setup, expected state, reason starts with
    ("refused", "Connection refused", None, False, None, N, "not sent"),
    ("dns-failure", "Name or service not known", None, True, None, N, "not sent"),
    ("no-tcp-beats-message", "server closed connection", None, False, None, N, "not sent"),
    ("tls-handshake-failed", "TLS handshake failed", 1.0, True, None, N, "not sent"),
    ("tls-no-handshake-then-closed", "server closed connection", 1.0, True, None, N, "not sent"),
    ("refused-stream-h2", "stream reset: REFUSED_STREAM", 1.0, True, 2.0, N, "not sent"),
    ("refused-stream-h2c", "Received RST_STREAM: REFUSED_STREAM (0x7)", 1.0, False, None, N, "not sent"),
    ("server-closed-tls", "server closed connection", 1.0, True, 2.0, U, "outcome unknown"),
    ("server-closed-plain", "server closed connection", 1.0, False, None, U, "outcome unknown"),
    ("client-disconnected", "Client disconnected.", 1.0, True, 2.0, U, "outcome unknown"),
    ("peer-closed", "peer closed connection", 1.0, False, None, U, "outcome unknown"),
    ("timeout", "Connection timed out", 1.0, True, 2.0, U, "outcome unknown"),
    ("other-rst", "stream reset: CANCEL", 1.0, True, 2.0, U, "outcome unknown"),
    ("tcp-setup-at-zero", "server closed connection", 0.0, False, None, U, "outcome unknown"),
]


@pytest.mark.parametrize(
    "message, tcp_setup, tls, tls_setup, expected, prefix", [pytest.param(*e[1:], id=e[0]) for e in ERRORS]
)
def test_classify_error(message, tcp_setup, tls, tls_setup, expected, prefix):
    state, reason = classify_error(message, tcp_setup=tcp_setup, tls=tls, tls_setup=tls_setup)
    assert state is expected
    assert reason.startswith(prefix)
    assert message in reason


EXTERNAL_IDS = [
    # id, body, dotted, expected
    ("top-level-string", b'{"id": "art_1"}', "id", "art_1"),
    ("int", b'{"id": 42}', "id", "42"),
    ("dotted", b'{"data": {"article": {"id": 7}}}', "data.article.id", "7"),
    ("list-index", b'{"items": [{"id": "a"}, {"id": "b"}]}', "items.1.id", "b"),
    ("missing", b'{"data": {}}', "data.id", None),
    ("missing-top-level", b'{"other": 1}', "id", None),
    ("null", b'{"id": null}', "id", None),
    ("nested-dict-value", b'{"id": {"value": 1}}', "id", None),
    ("list-value", b'{"id": [1, 2]}', "id", None),
    ("non-json", b"<html>Created</html>", "id", None),
    ("non-utf8", b"\xff\xfe binary", "id", None),
    ("truncated-json", b'{"id": 4', "id", None),
    ("empty-body", b"", "id", None),
    ("no-dotted-path", b'{"id": 42}', None, None),
    ("empty-dotted-path", b'{"id": 42}', "", None),
]


@pytest.mark.parametrize("body, dotted, expected", [pytest.param(*e[1:], id=e[0]) for e in EXTERNAL_IDS])
def test_external_id_of(body, dotted, expected):
    assert external_id_of(body, dotted) == expected


# --- an answer whose body was not read (past receipts_response_cap): head_outcome ---------------

SLACKISH = "[{status: 200, body: {ok: false}, state: rejected}, {status: 4xx, state: outcome_unknown}]"


@pytest.mark.parametrize(
    ("status", "classify", "state", "evidence"),
    [
        (200, None, S, False),  # no rules: the status decides, as ever
        (500, None, U, False),
        (403, None, R, False),
        (200, SLACKISH, U, False),  # a rule that reads the body fits the status: the body would have decided
        (201, SLACKISH, S, False),  # no rule fits: the status decides
        (409, SLACKISH, U, False),  # a status-only rule fits: it decides
    ],
)
def test_an_answer_whose_body_was_not_read_is_classified_from_its_head(status, classify, state, evidence):
    from proxy_addon.outcome.classify import head_outcome

    operation = op("/v1/overridden", classify) if classify else op("/v1/plain")
    out = head_outcome(status, "", {}, operation, None, "its body is larger than receipts_response_cap")
    assert (out.state, out.evidence, out.http_status) == (state, evidence, status)
    assert "receipts_response_cap" in out.reason
    assert out.external_id is None


# --- failures of our own exchange: which local refusals prove nothing was written (failure_outcome) -----


class Listener:
    """A loopback socket that keeps every byte each connection wrote to it, and never answers."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections: list[bytearray] = []
        self.done: list[threading.Event] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            data, done = bytearray(), threading.Event()
            self.connections.append(data)
            self.done.append(done)
            threading.Thread(target=self._read, args=(conn, data, done), daemon=True).start()

    @staticmethod
    def _read(conn, data: bytearray, done) -> None:
        conn.settimeout(5)
        with conn:
            try:
                while chunk := conn.recv(65536):
                    data += chunk
            except OSError:
                pass
        done.set()

    def received(self, connections: int) -> int:
        """Bytes written to it by `connections` connections, once they have closed (the client closes after failing)."""
        import time

        deadline = time.monotonic() + 5
        while len(self.done) < connections and time.monotonic() < deadline:  # accepted on the listener's thread
            time.sleep(0.01)
        assert len(self.done) == connections, f"{len(self.done)} connections, not {connections}"
        for done in list(self.done):
            assert done.wait(5), "a connection stayed open"
        return sum(len(d) for d in self.connections)

    def close(self) -> None:
        self.sock.close()


async def raised(listener: Listener, how: str) -> BaseException:
    """What a real httpx.AsyncClient (as the exchange uses it: HTTP/1.1) raises for each way of failing."""
    import httpx

    url = f"http://127.0.0.1:{listener.port}/v1/plain"
    async with httpx.AsyncClient(timeout=2) as client:
        try:
            if how == "invalid-url":  # as exchange.send builds the URL
                client.build_request("POST", httpx.URL(scheme="http", host="a\x00b", port=80))
            elif how == "unsupported-scheme":
                await client.send(client.build_request("POST", f"ftp://127.0.0.1:{listener.port}/"))
            elif how == "connect-refused":
                import socket

                with socket.socket() as bound:  # bound, never listening: a connection to it is refused
                    bound.bind(("127.0.0.1", 0))
                    await client.post(f"http://127.0.0.1:{bound.getsockname()[1]}/", content=b"{}")
            elif how == "read-timeout":
                await client.post(url, content=b"{}", timeout=httpx.Timeout(2, read=0.2))
            else:
                headers, content = {
                    "folded-value": ([(b"Host", b"h"), (b"api-key", b"SECRET-FOLDED\r\n more")], b"{}"),
                    "nul-in-value": ([(b"Host", b"h"), (b"X-Note", b"a\x00b")], b"{}"),
                    "name-not-a-token": ([(b"Host", b"h"), (b"X Note", b"a")], b"{}"),
                    "two-hosts": ([(b"Host", b"h"), (b"Host", b"h")], b"{}"),
                    "body-short-of-content-length": ([(b"Host", b"h"), (b"Content-Length", b"10")], b"abc"),
                }[how]
                await client.send(client.build_request("POST", url, headers=headers, content=content))
        except Exception as e:
            return e
    raise AssertionError(f"{how}: nothing was raised")


LOCAL_FAILURES = [
    # id, state, the reason says, bytes the listener read (None: no connection was made)
    ("folded-value", N, "refused the request before writing any of it", 0),
    ("nul-in-value", N, "refused the request before writing any of it", 0),
    ("name-not-a-token", N, "refused the request before writing any of it", 0),
    ("two-hosts", N, "Found multiple Host: headers", 0),
    ("invalid-url", N, "InvalidURL", None),
    ("unsupported-scheme", N, "UnsupportedProtocol", None),
    ("connect-refused", N, "never established", None),
    # The head was written, then h11 refused the body (an h11 error httpcore does not map): maybe sent.
    ("body-short-of-content-length", U, "Too little data for declared Content-Length", "some"),
    ("read-timeout", U, "ReadTimeout", "some"),
]


@pytest.mark.parametrize(("how", "state", "says", "written"), [pytest.param(*row, id=row[0]) for row in LOCAL_FAILURES])
async def test_a_local_refusal_is_not_sent_only_when_nothing_was_written(how, state, says, written):
    from proxy_addon.outcome.classify import failure_outcome
    from proxy_addon.outcome.exchange_failures import CLIENT_ERRORS

    listener = Listener()
    try:
        e = await raised(listener, how)
        received = listener.received(connections=0 if written is None else 1)
    finally:
        listener.close()
    assert isinstance(e, CLIENT_ERRORS), repr(e)  # what the exchange catches (exchange.send)
    outcome = failure_outcome(e)
    assert (outcome.state, outcome.error) == (state, outcome.reason)
    assert says in outcome.reason
    assert "SECRET-FOLDED" not in outcome.reason  # a quoted header value is withheld
    if written == 0:
        assert received == 0  # connected, and not one byte written
    elif written is not None:
        assert received > 0


@pytest.mark.parametrize(
    "error",
    [
        pytest.param("httpx", id="httpx-LocalProtocolError-raised-elsewhere"),
        pytest.param("h11", id="h11-LocalProtocolError-raised-elsewhere"),
    ],
)
def test_a_local_protocol_error_not_raised_building_the_head_is_outcome_unknown(error):
    """HTTP/2 raises LocalProtocolError for an h2 error at any point: without the head-building frame, maybe sent."""
    import h11
    import httpx

    from proxy_addon.outcome.classify import failure_outcome

    cls = httpx.LocalProtocolError if error == "httpx" else h11.LocalProtocolError
    try:
        raise cls("Received header value surrounded by whitespace b' SECRET-H2 '")
    except Exception as e:
        outcome = failure_outcome(e)
    assert outcome.state is U
    assert outcome.reason.startswith("outcome unknown")
    assert "SECRET-H2" not in outcome.reason and "(value withheld)" in outcome.reason


BODY_RULES = """\
api: chat
hosts: [api.chat.test]
operations:
  post:
    match: {method: POST, path: /api/chat.postMessage}
    external_id: [channel, ts]
    classify:
      - {status: 200, body: {ok: false}, state: rejected}
"""


@pytest.mark.parametrize(
    "doc, state, external_id",
    [
        ({"ok": True, "channel": "C1", "ts": "1.5"}, S, "C1:1.5"),
        ({"ok": False, "channel": "C1", "ts": "1.5"}, R, None),
    ],
)
def test_an_answer_body_is_parsed_once_for_its_classify_rules_and_its_id(monkeypatch, doc, state, external_id):
    """A success's id is read from the parse the classify rules made of the body, not from a second one."""
    m = RuleSet.of([load_rules(BODY_RULES, "c.yaml")]).match("api.chat.test", 443, "POST", "/api/chat.postMessage")
    assert m is not None
    raw = json.dumps(doc).encode()
    parses: list[bytes] = []
    loads = json.loads

    def counted(s, *a, **k):
        parses.append(s)
        return loads(s, *a, **k)

    monkeypatch.setattr(json, "loads", counted)
    outcome = answer_outcome(200, "OK", {}, raw, m.operation)
    assert (outcome.state, outcome.external_id) == (state, external_id)
    assert parses.count(raw) == 1  # before: once for the rules, again for the id
