"""Unit tests for proxy_addon.classify: response statuses, upstream errors, external ids."""

from __future__ import annotations

import functools

import pytest

from proxy_addon.classify import classify_error, classify_status, external_id_of
from proxy_addon.rules import RuleSet, load_rules
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
    (200, S), (201, S), (202, S), (204, S), (301, S), (302, S), (304, S),
    (400, R), (401, R), (403, R), (404, R), (409, R), (410, R), (422, R), (429, R), (499, R),
    (408, U),
    (500, U), (502, U), (503, U), (504, U), (599, U),
]


@pytest.mark.parametrize("status, expected", [pytest.param(s, e, id=str(s)) for s, e in DEFAULTS])
@pytest.mark.parametrize("with_op", [pytest.param(False, id="no-op"), pytest.param(True, id="op-without-overrides")])
def test_classify_status_default(status, expected, with_op):
    assert classify_status(status, op("/v1/plain") if with_op else None) is expected


OVERRIDES = [
    (409, S),  # exact code beats its class
    (404, U), (400, U), (401, U), (422, U), (429, U), (408, U),  # the 4xx class override
    (200, S), (201, S), (304, S),  # no override: default
    (500, U), (502, U), (503, U),  # no override: default
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
    [pytest.param(202, U, id="202-overridden"), pytest.param(201, S, id="201-default"),
     pytest.param(404, R, id="404-default")],
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


@pytest.mark.parametrize(("status", "classify", "state", "evidence"), [
    (200, None, S, False),  # no rules: the status decides, as ever
    (500, None, U, False),
    (403, None, R, False),
    (200, SLACKISH, U, False),  # a rule that reads the body fits the status: the body would have decided
    (201, SLACKISH, S, False),  # no rule fits: the status decides
    (409, SLACKISH, U, False),  # a status-only rule fits: it decides
])
def test_an_answer_whose_body_was_not_read_is_classified_from_its_head(status, classify, state, evidence):
    from proxy_addon.classify import head_outcome

    operation = op("/v1/overridden", classify) if classify else op("/v1/plain")
    out = head_outcome(status, "", {}, operation, None, "its body is larger than receipts_response_cap")
    assert (out.state, out.evidence, out.http_status) == (state, evidence, status)
    assert "receipts_response_cap" in out.reason
    assert out.external_id is None
