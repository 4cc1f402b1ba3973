"""
The fault matrix: every upstream fault against every client, through a real proxy.

Each cell asserts what the upstream committed (it counts), the receipt's state and
events, what the client received, and what an identical second attempt gets.
`docs/guarantees.md` is generated from FAULTS (`.venv/bin/python -m tests.e2e.proxy.test_faults >
docs/guarantees.md`), and `test_guarantees_doc_matches_the_matrix` keeps them equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.conftest import ROOT, wait_for
from tests.e2e.processes import CLIENTS, Clients
from tests.upstream import Upstream, free_port

DOC = ROOT / "docs" / "guarantees.md"


@dataclass(frozen=True)
class Fault:
    id: str
    what: str  # for the doc
    upstream: str | None  # the test upstream's fault; None: no upstream listens (refused) or TLS fails
    client_gets: int | None  # the status the agent receives; None: its own timeout fires first
    answer: str | None  # the proxy's JSON "error", when the proxy answers instead of the upstream
    state: str  # the receipt's final state
    commits: int  # writes the upstream committed after the first attempt
    retry: str  # what an identical second attempt gets: replayed, blocked or forwarded
    retry_status: int | None


FAULTS = [
    Fault("ok", "the upstream commits and answers 201", "ok", 201, None, "succeeded", 1, "replayed", 201),
    Fault(
        "commit-then-drop",
        "commits, then closes the connection without answering",
        "drop",
        502,
        "outcome_unknown",
        "outcome_unknown",
        1,
        "blocked",
        409,
    ),
    Fault(
        "commit-then-hang",
        "commits, then holds the connection past the client's timeout (1 s) and closes at 2.5 s",
        "hang",
        None,
        None,
        "outcome_unknown",
        1,
        "blocked",
        409,
    ),
    Fault(
        "drop-before-commit",
        "closes the connection without committing or answering",
        "lost",
        502,
        "outcome_unknown",
        "outcome_unknown",
        0,
        "blocked",
        409,
    ),
    Fault("400", "refuses with 400", "400", 400, None, "rejected", 0, "forwarded", 201),
    Fault("429", "refuses with 429 and Retry-After", "429", 429, None, "rejected", 0, "forwarded", 201),
    Fault("500-after-commit", "commits, then answers 500", "500", 500, None, "outcome_unknown", 1, "blocked", 409),
    Fault(
        "half-response",
        "commits, sends half a response, closes",
        "half",
        502,
        "outcome_unknown",
        "outcome_unknown",
        1,
        "blocked",
        409,
    ),
    Fault("connection-refused", "nothing listens on the port", None, 502, "not_sent", "not_sent", 0, "forwarded", 502),
    Fault(
        "tls-handshake-failure",
        "the upstream's certificate is not trusted",
        None,
        502,
        "not_sent",
        "not_sent",
        0,
        "forwarded",
        502,
    ),
]


@dataclass(frozen=True)
class H2Fault(Fault):
    """A cell against the HTTP/2 upstream (tests/upstream_h2.py), run by tests/e2e/proxy/test_h2_upstream.py."""

    reused: bool = False  # the write goes on a later stream of a connection that carried one before


# RFC 9113 §8.7: a refused stream, or one above a GOAWAY's last-stream-id, was not processed.
H2_FAULTS = [
    H2Fault("h2-ok", "answers 201 over HTTP/2", "ok", 201, None, "succeeded", 1, "replayed", 201),
    H2Fault(
        "h2-refused-stream",
        "RST_STREAM(REFUSED_STREAM) on the write's stream, nothing committed",
        "refused",
        502,
        "not_sent",
        "not_sent",
        0,
        "forwarded",
        201,
    ),
    H2Fault(
        "h2-goaway-excluding",
        "GOAWAY with last-stream-id 0, below the write's stream 1; nothing committed",
        "goaway",
        502,
        "not_sent",
        "not_sent",
        0,
        "forwarded",
        201,
    ),
    H2Fault(
        "h2-goaway-excluding-later-stream",
        "GOAWAY with last-stream-id 1, on a connection reused for the "
        "write's stream 3; nothing committed (httpcore would send it again on a new connection: it is not)",
        "goaway",
        502,
        "not_sent",
        "not_sent",
        0,
        "forwarded",
        201,
        reused=True,
    ),
    H2Fault(
        "h2-goaway-including",
        "commits, then GOAWAY with the write's stream as last-stream-id",
        "goaway-after",
        502,
        "outcome_unknown",
        "outcome_unknown",
        1,
        "blocked",
        409,
    ),
    H2Fault(
        "h2-rst-internal-error",
        "commits, then RST_STREAM(INTERNAL_ERROR)",
        "reset",
        502,
        "outcome_unknown",
        "outcome_unknown",
        1,
        "blocked",
        409,
    ),
    H2Fault(
        "h2-rst-cancel",
        "commits, then RST_STREAM(CANCEL)",
        "cancel",
        502,
        "outcome_unknown",
        "outcome_unknown",
        1,
        "blocked",
        409,
    ),
    H2Fault(
        "h2-drop-after-commit",
        "commits, then closes the TCP connection",
        "drop",
        502,
        "outcome_unknown",
        "outcome_unknown",
        1,
        "blocked",
        409,
    ),
]

RETRY_MEANS = {
    "replayed": "the recorded answer, with `X-Receipt-Replayed: true`; not sent again",
    "blocked": "409 `duplicate_unresolved`; not sent again",
    "forwarded": "sent as a new attempt with `retry_of` set",
}


@dataclass(frozen=True)
class SameWrite:
    """A row of "Requests we treat as the same write": two requests that are one intent, and the test that shows it."""

    what: str  # the equivalence
    one: str  # a request
    other: str  # another spelling of the same write
    test: str  # the pytest node id that shows it


# Targets: matched and fingerprinted in their canonical form (proxy_addon/wire/canonical.py); each spelling
# gets a receipt, the second is replayed (or blocked), the upstream sees one write, sent as written.
_SW = "tests/e2e/proxy/test_canonical_requests.py::"
_MO = "tests/e2e/proxy/test_method_override.py::"
SAME_WRITE_TARGETS = [
    SameWrite(
        "a percent-encoded unreserved character is the character",
        "POST /api/b/thing%73",
        "POST /api/b/things",
        _SW + "test_spellings_of_a_path_are_one_write[encoded-letter]",
    ),
    SameWrite(
        "...in a path parameter too (which the fingerprint takes decoded)",
        "POST /api/b/items/%745",
        "POST /api/b/items/t5",
        _SW + "test_spellings_of_a_path_are_one_write[encoded-item-parameter]",
    ),
    SameWrite(
        "...and in the segment a rule's `{param}` matches",
        "POST /api/%62/things",
        "POST /api/b/things",
        _SW + "test_spellings_of_a_path_are_one_write[encoded-path-parameter]",
    ),
    SameWrite(
        "a run of slashes is one slash (nginx `merge_slashes`)",
        "POST //api/b/things",
        "POST /api/b/things",
        _SW + "test_spellings_of_a_path_are_one_write[double-slash]",
    ),
    SameWrite(
        "a `.` segment is removed",
        "POST /api/b/./things",
        "POST /api/b/things",
        _SW + "test_spellings_of_a_path_are_one_write[dot-segment]",
    ),
    SameWrite(
        "a `..` segment removes the one before it",
        "POST /api/x/../b/things",
        "POST /api/b/things",
        _SW + "test_spellings_of_a_path_are_one_write[dot-dot-segment]",
    ),
    SameWrite(
        "...percent-encoded too",
        "POST /api/x/%2e%2E/b/things",
        "POST /api/b/things",
        _SW + "test_spellings_of_a_path_are_one_write[encoded-dot-dot]",
    ),
    SameWrite(
        "all of these at once",
        "POST //api/./x/../%62//thing%73",
        "POST /api/b/things",
        _SW + "test_spellings_of_a_path_are_one_write[all-at-once]",
    ),
    SameWrite(
        "a second spelling while the first is unresolved: blocked, not sent",
        "POST //api/b/./things (dropped)",
        "POST /api/b/thing%73",
        _SW + "test_a_second_spelling_of_an_unresolved_write_is_blocked",
    ),
    SameWrite(
        "an IPv4 address in fewer parts",
        "http://127.1:8080/...",
        "http://127.0.0.1:8080/...",
        _SW + "test_numeric_aliases_of_the_host_are_one_write[127.1]",
    ),
    SameWrite(
        "an IPv4 address as one number",
        "http://2130706433:8080/...",
        "http://127.0.0.1:8080/...",
        _SW + "test_numeric_aliases_of_the_host_are_one_write[2130706433]",
    ),
    SameWrite(
        "...in hex",
        "http://0x7f000001:8080/...",
        "http://127.0.0.1:8080/...",
        _SW + "test_numeric_aliases_of_the_host_are_one_write[0x7f000001]",
    ),
    SameWrite(
        "...in octal",
        "http://0177.0.0.1:8080/...",
        "http://127.0.0.1:8080/...",
        _SW + "test_numeric_aliases_of_the_host_are_one_write[0177.0.0.1]",
    ),
    SameWrite(
        "an IPv4-mapped IPv6 address is the IPv4 address",
        "http://[::ffff:127.0.0.1]:8080/...",
        "http://127.0.0.1:8080/...",
        _SW + "test_numeric_aliases_of_the_host_are_one_write[[::ffff:127.0.0.1]]",
    ),
    SameWrite(
        "HTTPS to an alias: the CONNECT is intercepted like the address's",
        "https://127.1:8443/...",
        "https://127.0.0.1:8443/...",
        _SW + "test_a_connect_to_an_alias_of_an_ip_host_is_intercepted[127.1]",
    ),
    SameWrite(
        "an IPv6 address in any spelling is its compressed form",
        "http://[0:0:0:0:0:0:0:1]/...",
        "http://[::1]/...",
        "tests/wire/test_canonical.py::test_canonical_host[v6-loopback-long]",
    ),
    SameWrite(
        "a loopback name under a rule that names another one (`localhost`, `127.0.0.1`, `::1`, `0.0.0.0`, "
        "`::`): before, passed with no receipt",
        "http://localhost:8080/... (dropped)",
        "http://127.0.0.1:8080/..., http://[::1]:8080/...",
        "tests/e2e/proxy/test_request_target.py::test_localhost_under_a_rule_naming_127_0_0_1_gets_a_receipt_and_its_"
        "retries_are_blocked",
    ),
    SameWrite(
        "HTTPS to a loopback alias: the CONNECT is intercepted (before, tunnelled untouched)",
        "https://localhost:8443/...",
        "https://localhost:8443/... (replayed)",
        "tests/e2e/proxy/test_request_target.py::test_https_to_localhost_is_intercepted_and_replayed",
    ),
    SameWrite(
        "the host in any letter case, with or without a trailing dot",
        "https://API.Test./...",
        "https://api.test/...",
        "tests/wire/test_canonical.py::test_equivalent_targets_are_one_fingerprint_and_the_raw_one_is_kept",
    ),
    SameWrite(
        "letter case in the path, only where the rule says `match.case_insensitive: true`",
        "POST /API/b/CASED",
        "POST /api/b/cased",
        _SW + "test_case_insensitive_true_makes_them_one_write",
    ),
    SameWrite(
        "an overridden method is the method it names (`X-HTTP-Method-Override`, `X-HTTP-Method`, "
        "`X-Method-Override`, any letter case)",
        "GET /api/b/things + X-HTTP-Method-Override: POST",
        "POST /api/b/things",
        _MO + "test_an_overridden_write_gets_a_receipt_and_is_one_write_with_the_plain_one[get-as-post]",
    ),
    SameWrite(
        "...in either direction",
        "POST /api/b/things/7 + X-HTTP-Method-Override: PUT",
        "PUT /api/b/things/7",
        _MO + "test_an_overridden_write_gets_a_receipt_and_is_one_write_with_the_plain_one[post-as-put]",
    ),
    SameWrite(
        "...while the first is unresolved: blocked, not sent",
        "GET /api/b/things + X-HTTP-Method-Override: POST (dropped)",
        "POST /api/b/things",
        _MO + "test_a_second_write_while_the_first_is_unresolved_is_blocked[override-then-plain]",
    ),
    SameWrite(
        "any mix of these target spellings, with bodies in any key order, whitespace, Unicode normal form "
        "(NFC, NFD), content coding (identity, gzip, deflate) and method overrides, at random",
        "(hypothesis)",
        "(hypothesis)",
        "tests/intent/test_fingerprint_same_write.py::test_equivalent_requests_are_one_fingerprint",
    ),
]

# Bodies: equivalent bodies (content codings, key order and whitespace, Unicode normal forms) are
# one intent too. Their rows go here, in the same form.
_EW = "tests/e2e/proxy/test_encoded_writes.py::test_the_same_body_in_every_encoding_is_one_write[plain]"
_JO = "tests/e2e/proxy/test_json_one_way.py::"
_IS = "tests/intent/test_fingerprint_secrets.py::"
SAME_WRITE_BODIES: list[SameWrite] = [
    SameWrite(
        "a gzip-encoded body is the body (`gzip -n`, `gzip -n -1`: any level)",
        '{"title": "x"}',
        "the same, Content-Encoding: gzip",
        _EW,
    ),
    SameWrite(
        "...deflate (zlib or raw), br, zstd", '{"title": "x"}', "the same, Content-Encoding: br (or deflate, zstd)", _EW
    ),
    SameWrite(
        "...stacked codings, undone last-applied first", '{"title": "x"}', "the same, Content-Encoding: gzip, br", _EW
    ),
    SameWrite(
        "JSON key order and whitespace",
        '{"a": 1, "title": "x"}',
        '{"title":"x","a":1}',
        "tests/intent/test_fingerprint.py::test_same_intent_same_fingerprint_whatever_the_json_layout[reversed-key-order]",
    ),
    SameWrite(
        "a body sent in chunks or with a Content-Length",
        "Transfer-Encoding: chunked",
        "Content-Length: n",
        "tests/e2e/proxy/test_bad_input.py::test_chunked_body_is_fingerprinted_by_its_content_not_its_framing",
    ),
    SameWrite(
        "Unicode NFC and NFD (`é` as one code point or `e` + U+0301), literal or `\\u` escaped",
        '{"title": "café"} (NFC)',
        '{"title": "café"} (NFD)',
        "tests/e2e/proxy/test_encoded_writes.py::test_nfc_and_nfd_are_one_write",
    ),
    SameWrite(
        "...in a JSON key the rule names",
        '{"café": 1} (NFC)',
        '{"café": 1} (NFD)',
        _IS + "test_nfc_and_nfd_are_one_intent[json-key-sent-nfd]",
    ),
    SameWrite(
        "...in form values, multipart text parts, GraphQL arguments, query values",
        "title=caf%C3%A9",
        "title=cafe%CC%81",
        _IS + "test_nfc_and_nfd_are_one_intent[form-value]",
    ),
    SameWrite(
        "a JSON object sent as a form (`curl -d`) and as JSON, when the form has none of the named fields",
        'curl -d \'{"title": "x"}\'',
        "Content-Type: application/json",
        "tests/e2e/proxy/test_encoded_writes.py::test_curl_d_json_is_read_as_json_and_its_fallback_is_reported",
    ),
    SameWrite(
        "a named field missing and the same field null",
        '{"title": "x"}',
        '{"title": "x", "meta": null}',
        _IS + "test_missing_fields_count_as_null_and_are_noted",
    ),
    SameWrite(
        "a named object in any key order (stored as its keyed hash)",
        '{"meta": {"a": 1, "b": 2}}',
        '{"meta": {"b": 2, "a": 1}}',
        _IS + "test_a_named_object_is_stored_as_a_keyed_hash_and_still_tells_objects_apart",
    ),
    SameWrite(
        "a JSON number by its value (fingerprint scheme 3)",
        '{"amount": 1}',
        '{"amount": 1.0}',
        _JO + "test_numbers_are_one_intent_by_value[1-1.0]",
    ),
    SameWrite(
        "...in any exponent spelling",
        '{"amount": 100}',
        '{"amount": 1e2}',
        _JO + "test_numbers_are_one_intent_by_value[100-1e2]",
    ),
    SameWrite(
        "the same text in the charset the body declares (JSON or form; scheme 3)",
        '{"title": "café"} (UTF-8)',
        "the same in Latin-1, charset=latin-1",
        _JO + "test_the_declared_charset_is_read",
    ),
]

SAME_WRITE = SAME_WRITE_TARGETS + SAME_WRITE_BODIES

# And what is NOT the same write: each is another resource to the server, so another intent.
NOT_SAME_WRITE = [
    SameWrite(
        "an encoded slash is not a slash",
        "POST /api/a%2Fb/things",
        "POST /api/a/b/things",
        "tests/wire/test_canonical.py::test_what_is_not_merged[encoded-slash]",
    ),
    SameWrite(
        "a reserved character is not its encoding",
        "POST /api/a%3Ab",
        "POST /api/a:b",
        "tests/wire/test_canonical.py::test_what_is_not_merged[encoded-colon]",
    ),
    SameWrite(
        "a percent sign decodes once",
        "POST /api/%2541",
        "POST /api/A",
        "tests/wire/test_canonical.py::test_what_is_not_merged[percent-once]",
    ),
    SameWrite(
        "letter case in the path (unless the rule says otherwise): passed through, no receipt",
        "POST /API/b/things",
        "POST /api/b/things",
        _SW + "test_a_path_in_other_letter_case_is_another_path",
    ),
    SameWrite(
        "the query string, which is kept as sent",
        "POST /a?x=%7e",
        "POST /a?x=~",
        "tests/wire/test_canonical.py::test_what_is_not_merged[query-encoding]",
    ),
    SameWrite(
        "any two different intents, spelled at random",
        "(hypothesis)",
        "(hypothesis)",
        "tests/intent/test_fingerprint_same_write.py::test_different_intents_are_different_fingerprints",
    ),
    SameWrite(
        "a value past the stored intent's bound (4 KiB) is stored as a hash, and fingerprinted whole",
        '{"title": "t…t"} (10,000 t)',
        '{"title": "t…u"}',
        "tests/intent/test_body_view_bound.py::test_a_value_past_the_bound_is_stored_as_a_keyed_hash_and_noted",
    ),
    SameWrite(
        "NFC is not accent folding",
        '{"title": "café"}',
        '{"title": "cafe"}',
        "tests/intent/test_fingerprint_secrets.py::test_nfc_and_nfd_are_one_intent[json-value]",
    ),
    SameWrite(
        "two different objects under a named field",
        '{"meta": {"k": "a"}}',
        '{"meta": {"k": "b"}}',
        "tests/e2e/proxy/test_intent_secrets.py::test_names_on_no_list_reach_no_db_wal_or_log",
    ),
    SameWrite(
        "two numbers a double cannot tell apart (each its exact value)",
        '{"amount": 1e400}',
        '{"amount": 2e400}',
        _JO + "test_numbers_are_one_intent_by_value[1e400-2e400]",
    ),
    SameWrite(
        "...below a double's precision",
        '{"amount": 0.1}',
        '{"amount": 0.1000000000000000000001}',
        _JO + "test_numbers_are_one_intent_by_value[0.1-0.1000000000000000000001]",
    ),
    SameWrite(
        "a form and the same fields as JSON (a form's values are text, JSON's typed: docs/rules.md)",
        "title=x&amount=1",
        '{"title": "x", "amount": 1}',
        "tests/wire/test_json_body.py::test_the_stored_intent_shows_numbers_by_value_and_hashes_what_no_double_holds",
    ),
    SameWrite(
        "two different bodies without any of the named fields (each hashed whole)",
        '{"name": "x"}',
        '{"name": "x"} ',
        "tests/intent/test_fingerprint_secrets.py::test_each_fallback_is_recorded_and_hashes_the_whole_body[none-of-the-fields]",
    ),
]


def same_write_lines() -> list[str]:
    lines = [
        "## Requests we treat as the same write",
        "",
        "Rules match, and fingerprints are taken, on the canonical form of a request (RFC 3986",
        "normalisation, as servers such as nginx route): the spellings below are one intent, so",
        "each gets a receipt, a second one is replayed (or blocked while the first is unresolved),",
        "and the upstream sees one write. The request goes upstream exactly as the agent sent it;",
        "the receipt keeps the spelling it was sent in (`raw_target`) beside the canonical `target`.",
        "",
        "| the same write | one request | another | shown by |",
        "|---|---|---|---|",
    ]
    lines += [_row(s) for s in SAME_WRITE]
    lines += [
        "",
        "Not the same write (another resource to the server, so another intent):",
        "",
        "| different writes | one request | another | shown by |",
        "|---|---|---|---|",
    ]
    lines += [_row(s) for s in NOT_SAME_WRITE]
    return [*lines, ""]


def _row(s: SameWrite) -> str:
    def code(text: str) -> str:
        return text if text.startswith("(") else f"`{text}`"

    return f"| {s.what} | {code(s.one)} | {code(s.other)} | `{s.test}` |"


@dataclass(frozen=True)
class Refused:
    """A row of "Requests our HTTP client cannot send": what the agent and the receipt get, and the test."""

    what: str  # the request
    agent_gets: str
    receipt: str
    retry: str  # what the same write, made sendable, gets
    test: str  # the pytest node id that shows it


_LR = "tests/e2e/proxy/test_local_refusals.py::"
_LR_HEADER = _LR + "test_a_header_no_client_can_send_gets_400_naming_it_and_nothing_leaves"
REFUSED = [
    Refused(
        "a header folded onto a second line (obs-fold), which mitmproxy passes on as `first\\r\\n second`",
        "400 `bad_header` naming the header, never its value",
        "none",
        "a first write",
        _LR_HEADER + "[obs-fold-forward-addon]",
    ),
    Refused(
        "a header value holding a bare CR, a LF, a NUL, a VT or FF",
        "400 `bad_header`",
        "none",
        "a first write",
        _LR_HEADER + "[bare-cr-forward-addon]",
    ),
    Refused(
        "...with `receipts_forward=mitmproxy` too (mitmproxy would send it on as it came)",
        "400 `bad_header`",
        "none",
        "a first write",
        _LR_HEADER + "[obs-fold-forward-mitmproxy]",
    ),
    Refused(
        "a header name that is not a token",
        "mitmproxy's own 400; with `validate_inbound_headers` off, 400 `bad_header`",
        "none",
        "a first write",
        _LR + "test_a_header_name_that_is_not_a_token_gets_400[validate_inbound_headers-off]",
    ),
    Refused(
        "a request head our client will not build for another reason (two `Host` fields)",
        "502 `not_sent`",
        "`not_sent`, the refusal as its reason",
        "sent as a new attempt with `retry_of` set",
        _LR + "test_a_request_our_client_refuses_is_recorded_not_sent_and_its_retry_goes_through",
    ),
    Refused(
        "a URL or scheme our client refuses (`InvalidURL`, `UnsupportedProtocol`)",
        "502 `not_sent`",
        "`not_sent`",
        "sent as a new attempt with `retry_of` set",
        "tests/outcome/test_classify.py::test_a_local_refusal_is_not_sent_only_when_nothing_was_written[invalid-url]",
    ),
    Refused(
        "a refusal after the head was written (h11: a body short of its `Content-Length`, which the exchange "
        "sets itself: shown on the client alone)",
        "502 `outcome_unknown`",
        "`outcome_unknown`",
        "409 `duplicate_unresolved`",
        "tests/outcome/test_classify.py::test_a_local_refusal_is_not_sent_only_when_nothing_was_written"
        "[body-short-of-content-length]",
    ),
]


# Bodies the proxy and a server could read as two different requests: refused, never guessed (issue 24).
READ_TWO_WAYS = [
    Refused(
        'a key twice in one JSON object (`{"title": "a", "title": "b"}`), at any depth; two keys '
        "that are one text in NFC",
        "400 `bad_json` naming the key and where, never a value",
        "none",
        "a first write",
        _JO + "test_a_key_twice_in_a_json_body_is_refused",
    ),
    Refused(
        "an MCP tool call with an invalid UTF-8 byte (Node and Go read it as U+FFFD): before, passed as "
        '"not JSON", ran twice, no receipt',
        "400, a JSON-RPC error -32600 under its id",
        "none",
        "a first write",
        _JO + "test_an_mcp_call_with_invalid_utf8_is_refused",
    ),
    Refused(
        "a GraphQL mutation with an invalid UTF-8 byte: before, ran twice, no receipt",
        "400 `bad_json`",
        "none",
        "a first write",
        _JO + "test_a_graphql_mutation_with_invalid_utf8_is_refused",
    ),
    Refused(
        '`"Method": "tools/call"` (Go matches keys regardless of case): before, ran twice, no receipt',
        "400, JSON-RPC -32600",
        "none",
        "a first write",
        _JO + "test_keys_that_differ_only_by_case_are_refused[Method]",
    ),
    Refused(
        '`"method": "tools/list", "METHOD": "tools/call"` (Go keeps the last): before, ran twice, no receipt',
        "400, JSON-RPC -32600",
        "none",
        "a first write",
        _JO + "test_keys_that_differ_only_by_case_are_refused[method and METHOD]",
    ),
    Refused(
        '`"name": "list_issues", "NAME": "create_issue"`: before, ran twice, no receipt',
        "400, JSON-RPC -32600",
        "none",
        "a first write",
        _JO + "test_keys_that_differ_only_by_case_are_refused[name and NAME]",
    ),
    Refused(
        "a named argument in another case (`Title`): before, a retry with another `Title` got the first one's replay",
        "400, JSON-RPC -32600",
        "none",
        "a first write",
        _JO + "test_keys_that_differ_only_by_case_are_refused[Title]",
    ),
    Refused(
        '`"Query": "mutation ..."`, or `"query": "query ...", "QUERY": "mutation ..."`: before, ran twice, no receipt',
        "400 `bad_json`",
        "none",
        "a first write",
        _JO + "test_keys_that_differ_only_by_case_are_refused[query and QUERY]",
    ),
]


def read_two_ways_lines() -> list[str]:
    lines = [
        "## Bodies a server could read otherwise",
        "",
        "A body the proxy and a server could read as two different requests is refused, never",
        'guessed, and counted as `bad_json` in `receipt_proxy_refused_total` (docs/rules.md, "JSON is',
        'read one way"). The servers are ours, reading JSON as Node and Go do (`tests/lenient_json.py`).',
        "",
        "| the request | the agent gets | receipt | the same write, well formed | shown by |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r.what} | {r.agent_gets} | {r.receipt} | {r.retry} | `{r.test}` |" for r in READ_TWO_WAYS]
    return [*lines, ""]


@pytest.mark.parametrize("row", READ_TWO_WAYS, ids=lambda r: r.test.split("::")[-1])
def test_each_read_two_ways_row_of_the_doc_names_a_test_that_exists(row):
    test_each_same_write_row_names_a_test_that_exists(row)


# Requests a server could read differently from us: refused, never passed through unrecorded (issue 24).
_RT = "tests/e2e/proxy/test_request_target.py::"
AMBIGUOUS = [
    Refused(
        "a fragment in the request target (`POST /api/b/things#x`): Flask drops it and writes, uvicorn "
        "keeps it in the path",
        "400 `ambiguous_request_target`",
        "none",
        "a first write",
        _RT + "test_a_fragment_alone_is_refused_before_any_receipt",
    ),
    Refused(
        "...sent after the same write without it (Flask made a second object)",
        "400 `ambiguous_request_target`",
        "the first write's only",
        "the first write's answer",
        _RT + "test_a_fragment_after_a_write_is_refused_and_flask_makes_one_object",
    ),
    Refused(
        "`;` path parameters (`/api/b/things;jsessionid=1`): Tomcat, Jetty and Spring remove them, "
        "Werkzeug, Starlette and nginx keep them",
        "400 `ambiguous_request_target`",
        "the first write's only",
        "the first write's answer",
        _RT + "test_path_parameters_after_a_write_are_refused_and_a_servlet_sees_one_write[jsessionid-last-segment]",
    ),
    Refused(
        "...in a segment a `{param}` matches (`/api/b;v=1/things`, matched before as the bucket `b;v=1`)",
        "400 `ambiguous_request_target`",
        "the first write's only",
        "the first write's answer",
        _RT + "test_path_parameters_after_a_write_are_refused_and_a_servlet_sees_one_write[in-a-parameter-segment]",
    ),
    Refused(
        "...before a `..` segment (`/api/b/x/..;/things`, which Tomcat routes to `/api/b/things`)",
        "400 `ambiguous_request_target`",
        "the first write's only",
        "the first write's answer",
        _RT + "test_path_parameters_after_a_write_are_refused_and_a_servlet_sees_one_write[dot-dot-semicolon]",
    ),
    Refused(
        "a byte that is not UTF-8 (Latin-1, an encoded surrogate) in a header the proxy reads as text (one the "
        "fingerprint names, a credential, the idempotency key); before, 503 `receipt_store_unavailable`",
        "400 `undecodable_header` naming the header, never its value",
        "none",
        "a first write",
        "tests/e2e/proxy/test_undecodable_text.py::test_undecodable_text_in_a_header_the_proxy_reads_gets_400_and_nothing"
        "_leaves[latin-1-in-a-fingerprinted-header]",
    ),
    Refused(
        'a JSON `"\\ud800"` escape without its pair in a fingerprinted field (Python keeps it, Go replaces it); '
        "before, 503 `receipt_store_unavailable`",
        "400 `unpaired_surrogate`",
        "none",
        "a first write",
        "tests/e2e/proxy/test_undecodable_text.py::test_an_unpaired_surrogate_in_a_fingerprinted_field_gets_400_and_nothing"
        "_leaves[lone-high-surrogate]",
    ),
]


def ambiguous_lines() -> list[str]:
    lines = [
        "## Requests a server could read differently from us",
        "",
        "Where servers disagree on what a request means, and one reading is a write a rule matches, the",
        "proxy answers 400 before any receipt and sends nothing: never a write passed through unrecorded.",
        "A request that no reading makes a write passes untouched; `%3B` is data to every server and is",
        'matched as before (docs/rules.md, "Matching on the canonical form").',
        "",
        "| the request | the agent gets | receipts | the same write, sent plainly | shown by |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r.what} | {r.agent_gets} | {r.receipt} | {r.retry} | `{r.test}` |" for r in AMBIGUOUS]
    return [*lines, ""]


@pytest.mark.parametrize("row", AMBIGUOUS, ids=lambda r: r.test.split("::")[-1])
def test_each_ambiguous_row_of_the_doc_names_a_test_that_exists(row):
    test_each_same_write_row_names_a_test_that_exists(row)


def h2_lines() -> list[str]:
    lines = [
        "## Over HTTP/2",
        "",
        "The addon's exchange speaks HTTP/2 to an upstream that offers it (ALPN h2) while",
        "mitmproxy's `http2` option is on, its default. These cells run against an HTTP/2 upstream",
        "(`tests/upstream_h2.py`, the `h2` library on TLS) with each client, in",
        "`tests/e2e/proxy/test_h2_upstream.py`; the upstream records that every write came over HTTP/2 and",
        "that none came twice. `not_sent` only where RFC 9113 §8.7 proves the upstream did not",
        "process the request; anything else after sending is `outcome_unknown`.",
        "",
        "| fault | the upstream | the agent gets | receipt | upstream commits | an identical retry gets |",
        "|---|---|---|---|---|---|",
    ]
    lines += [_fault_row(f) for f in H2_FAULTS]
    return [*lines, ""]


def _fault_row(f: Fault) -> str:
    got = "its own timeout" if f.client_gets is None else str(f.client_gets)
    if f.answer:
        got += f" `{f.answer}`"
    return f"| {f.id} | {f.what} | {got} | `{f.state}` | {f.commits} | {f.retry}: {RETRY_MEANS[f.retry]} |"


def refused_lines() -> list[str]:
    lines = [
        "## Requests our HTTP client cannot send",
        "",
        "A matched write that no HTTP client can send is answered by the proxy, and the upstream reads",
        "not a byte of it. A header field that cannot be sent gets 400 before any receipt; a refusal",
        "inside the exchange is `not_sent` only when it provably came before the first byte was",
        "written (outcome/exchange_failures.py says how that is known), and never blocks the same write made sendable.",
        "",
        "| the request | the agent gets | receipt | the same write, made sendable | shown by |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r.what} | {r.agent_gets} | {r.receipt} | {r.retry} | `{r.test}` |" for r in REFUSED]
    return [*lines, ""]


@pytest.mark.parametrize("row", REFUSED, ids=lambda r: r.test.split("::")[-1])
def test_each_refused_row_of_the_doc_names_a_test_that_exists(row):
    test_each_same_write_row_names_a_test_that_exists(row)


def render() -> str:
    lines = [
        "# What receipt-proxy guarantees, fault by fault",
        "",
        "Generated from the fault matrix in `tests/e2e/proxy/test_faults.py` with",
        "`.venv/bin/python -m tests.e2e.proxy.test_faults > docs/guarantees.md`; `scripts/test` runs every",
        "cell against `requests`, `httpx` and `curl` through a real mitmdump and a real upstream,",
        "and checks that this page still matches the matrix.",
        "",
        "| fault | the upstream | the agent gets | receipt | upstream commits | an identical retry gets |",
        "|---|---|---|---|---|---|",
    ]
    lines += [_fault_row(f) for f in FAULTS]
    lines += [
        "",
        "With a `reconcile` spec in the rule, a retry of an `outcome_unknown` receipt first",
        "triggers a read ([rules.md](rules.md#what-a-read-decides)): found → the `after_success` answer; proven "
        "absent →",
        "forwarded; not found where the read cannot prove absence → `manual_review` and 409; a",
        "read that fails → still `outcome_unknown`, 409 with `Retry-After`, and another read",
        "after it (`manual_review` after `receipts_read_attempts` failed reads). A retry that",
        "arrives while the first attempt is still in flight waits for its outcome",
        "(`receipts_wait_submitted`).",
        "",
    ]
    lines += h2_lines()
    lines += refused_lines()
    lines += read_two_ways_lines()
    lines += ambiguous_lines()
    lines += same_write_lines()
    lines += limits_lines()
    lines += held_lines()
    return "\n".join(lines)


# The bounds the proxy keeps: (option, what happens past it, the test that shows it). The
# defaults come from the options table itself, so this page cannot drift from the code.
LIMITS = [
    (
        "receipts_body_cap",
        "a matched request body larger than this (by Content-Length, chunked, or once its "
        "Content-Encoding is decoded) gets 413 `request_body_too_large`; nothing is sent, no receipt is written",
        "tests/e2e/proxy/test_memory.py::test_a_gzip_body_that_decodes_past_the_cap_is_refused_413_unsent",
    ),
    (
        "receipts_response_cap",
        "an answer is recorded (and replayable) up to this; past it the outcome is "
        "classified from the status and headers and recorded at once, and a duplicate gets 409, never a cut replay",
        "tests/e2e/proxy/test_memory.py::test_an_answer_past_the_record_cap_reaches_the_agent_whole_and_is_never_replayed",
    ),
    (
        "receipts_response_max",
        "the most of one answer held for the agent; past it the upstream connection is "
        "closed and the agent gets 502 `response_too_large` (once the agent has gone, reading stops at once)",
        "tests/e2e/proxy/test_memory.py::test_an_endless_answer_is_recorded_from_its_status_and_cut_at_the_bound",
    ),
    (
        "receipts_upstream_timeout",
        "no answer by then: the exchange is ended, the receipt is `outcome_unknown`, the agent gets 504",
        "tests/e2e/proxy/test_integration.py::test_upstream_deadline_ends_the_exchange",
    ),
    (
        "receipts_wait_submitted",
        "a duplicate of a write still in flight waits this long for its outcome, then gets 409",
        "tests/e2e/proxy/test_integration.py::test_a_duplicate_waits_only_as_long_as_receipts_wait_submitted",
    ),
    (
        "receipts_read_timeout",
        "a reconcile read that takes longer is a failed read",
        "tests/e2e/reconcile/test_failed_reads.py::test_a_failed_read_leaves_the_outcome_unknown_until_the_last_attempt",
    ),
    (
        "receipts_read_attempts",
        "failed reads after which the receipt goes to `manual_review`",
        "tests/e2e/reconcile/test_failed_reads.py::test_a_failed_read_leaves_the_outcome_unknown_until_the_last_attempt",
    ),
    (
        "receipts_read_backoff",
        "seconds before the next read after a failed one, doubling (at most an hour); "
        "an answer's `Retry-After` instead",
        "tests/reconcile/test_judge.py::test_retry_after_is_seconds_or_an_http_date",
    ),
    (
        "receipts_read_deadline",
        "seconds after the outcome became unknown past which a failed read sends the receipt to `manual_review`",
        "tests/e2e/reconcile/test_failed_reads.py::test_a_read_that_fails_past_the_deadline_goes_to_manual_review",
    ),
    (
        "receipts_reads_max",
        "reconcile reads the proxy runs at once; the others wait their turn, each at most "
        "`receipts_read_timeout`, then it is not read (nothing recorded) and its duplicates get 409; nothing else "
        "waits",
        "tests/e2e/reconcile/test_read_bound.py::test_forty_hanging_reads_run_at_most_reads_max_at_once_and_harm_nothing_else",
    ),
    (
        "receipts_drain_timeout",
        "on SIGTERM/SIGINT, how long the writes in flight may take to end (new ones get "
        "503 `not_sent`); what is left is recorded `outcome_unknown`",
        "tests/e2e/proxy/test_stop.py::test_a_write_that_outlasts_the_drain_timeout_is_recorded_outcome_unknown",
    ),
    (
        "receipts_approval_timeout",
        "a write held for approval and not decided by then is denied (403)",
        "tests/mitm/test_receipts_addon.py::test_approval_gate_times_out",
    ),
]


def limits_lines() -> list[str]:
    from proxy_addon.mitm.options import OPTIONS
    from proxy_addon.rules.loader import MAX_RULES_BYTES

    defaults = {o.name: o.default for o in OPTIONS}
    lines = [
        "## Limits",
        "",
        "Every bound is an option (`--set NAME=VALUE`); the defaults are the options' own.",
        "",
        "| option | default | past it | shown by |",
        "|---|---|---|---|",
    ]
    for name, what, test in LIMITS:
        lines.append(f"| `{name}` | {_amount(name, defaults[name])} | {what} | `{test}` |")
    lines.append(
        f"| (a rules file) | {_amount('bytes', MAX_RULES_BYTES)} | refused with file:line, as a file with a "
        "YAML alias is | `tests/rules/test_loader_limits.py::test_a_rules_file_past_the_size_bound_is_refused` |"
    )
    return [*lines, ""]


def _amount(name: str, value: int) -> str:
    if name.endswith("reads_max"):  # a count, not bytes
        return str(value)
    if name.endswith(("cap", "max", "bytes")):
        return f"{value // 1048576} MiB" if value % 1048576 == 0 else f"{value} bytes"
    return f"{value} s" if not name.endswith("attempts") else str(value)


def test_every_limit_names_an_option_and_a_test():
    from proxy_addon.mitm.options import OPTIONS

    names = {o.name for o in OPTIONS}
    root = DOC.parent.parent
    for name, _, test in LIMITS:
        assert name in names, name
        path, _, func = test.partition("::")
        assert (root / path).exists(), test
        assert not func or f"def {func.split('[')[0]}(" in (root / path).read_text(), test


@dataclass(frozen=True)
class HeldWrite:
    """A row of "Writes held for approval": what happens while a write is held, and the test that shows it."""

    what: str  # what happens while it is held
    agent_gets: str
    receipt: str
    sent: str  # what the upstream receives
    test: str  # the pytest node id that shows it
    also: tuple[str, ...] = ()  # more tests that show it ("::name": in the same file as `test`)

    def tests(self) -> list[str]:
        path = self.test.partition("::")[0]
        return [self.test, *(path + t if t.startswith("::") else t for t in self.also)]


_AP, _AD = "tests/e2e/run/test_approval.py::", "tests/mitm/test_receipts_addon.py::"
_CA, _CE, _MA = (
    "tests/cli/test_approval_commands.py::",
    "tests/e2e/cli/test_approval_commands.py::",
    "tests/mitm/test_approval.py::",
)
HELD_WRITES = [
    HeldWrite(
        "an operator resumes it",
        "the upstream's answer",
        "`submitted`, then its outcome",
        "the write, once",
        _AP + "test_an_operator_approves_one_held_write_and_denies_another",
    ),
    HeldWrite(
        "an operator kills it (Abort)",
        "403 `denied_by_operator`",
        '`rejected` "denied by operator"',
        "nothing",
        _AP + "test_an_operator_approves_one_held_write_and_denies_another",
    ),
    HeldWrite(
        "nobody decides within `receipts_approval_timeout`",
        "403 `denied_by_operator`",
        "`rejected`",
        "nothing",
        _AD + "test_approval_gate_times_out",
    ),
    HeldWrite(
        "a duplicate arrives while it is held",
        "409 `duplicate_unresolved` (the duplicate)",
        "`awaiting_approval`, unchanged",
        "nothing",
        _AD + "test_approval_gate_approve",
    ),
    HeldWrite(
        "an operator edits it in mitmweb (the request editor, `PUT /flows/<id>`), then resumes it",
        "403 `denied_by_operator`",
        '`rejected` "modified while held"',
        "nothing",
        _AP + "test_a_held_write_edited_in_mitmweb_is_denied_and_never_sent[put]",
    ),
    HeldWrite(
        "...a body upload (`POST /flows/<id>/request/content.data`)",
        "403 `denied_by_operator`",
        '`rejected` "modified while held"',
        "nothing",
        _AP + "test_a_held_write_edited_in_mitmweb_is_denied_and_never_sent[upload]",
    ),
    HeldWrite(
        "...its method, a header or its path",
        "403 `denied_by_operator`",
        '`rejected` "modified while held"',
        "nothing",
        _AD + "test_a_held_write_edited_then_resumed_is_denied_and_never_sent",
    ),
    HeldWrite(
        "an edit undone (mitmweb's Revert) before the resume",
        "the upstream's answer",
        "`submitted`, then its outcome",
        "the write as recorded, once",
        _AD + "test_a_held_write_edited_then_reverted_is_sent_as_recorded",
    ),
    HeldWrite(
        "the agent hangs up while it is held; a Resume comes later",
        "(gone)",
        '`rejected` "the agent hung up while the write was held", at once',
        "nothing",
        _AP + "test_a_held_write_whose_agent_hung_up_is_denied_and_a_later_resume_sends_nothing",
    ),
    HeldWrite(
        "Resume All (`A`) with several held",
        "each its upstream's answer",
        'each `submitted` ("approved by operator"), then its outcome',
        "each write, once",
        _AP + "test_resume_all_approves_each_held_write",
    ),
    HeldWrite(
        "the proxy stops (SIGTERM) while it is held",
        "503 `not_sent`",
        "`not_sent`",
        "nothing",
        "tests/e2e/proxy/test_stop.py::test_a_write_held_for_approval_is_not_sent_at_stop",
    ),
    HeldWrite(
        "mitmweb shows it",
        "nothing yet (it waits)",
        "`awaiting_approval`; the flow's comment says `AWAITING APPROVAL …` until it is decided",
        "nothing yet",
        _AD + "test_a_held_write_keeps_awaiting_approval_in_its_comment",
    ),
    HeldWrite(
        "`receipts approve ID` from another process",
        "the upstream's answer",
        '`submitted` ("approved by operator: NOTE", actor `cli:NAME`), then its outcome; the decision used',
        "the write, once, within a second",
        _CE + "test_an_approval_from_another_process_sends_one_write",
    ),
    HeldWrite(
        "`receipts deny ID --note NOTE` from another process",
        "403 `denied_by_operator`, the note as `reason`",
        '`rejected` "denied by operator: NOTE"',
        "nothing",
        _CE + "test_a_denial_from_another_process_answers_403_and_sends_nothing",
    ),
    HeldWrite(
        "a second decision, or one on a receipt not held (any other state, an unknown id)",
        "(unchanged)",
        "unchanged; refused with one line, exit 1, nothing written",
        "nothing more",
        _CA + "test_a_held_write_is_decided_once",
        ("::test_deciding_a_write_that_is_not_held_is_refused",),
    ),
    HeldWrite(
        "`--fingerprint` of another intent, or a recorded decision whose fingerprint is not the held write's",
        "nothing yet (it waits)",
        "`awaiting_approval`, unchanged",
        "nothing",
        _CA + "test_a_decision_binds_to_the_fingerprint_the_operator_saw",
        (_MA + "test_a_decision_for_another_intent_is_not_applied_and_the_write_stays_held",),
    ),
    HeldWrite(
        "edited in mitmweb, then approved from the CLI",
        "403 `denied_by_operator`",
        '`rejected` "modified while held"; the decision unused',
        "nothing",
        _MA + "test_a_held_write_edited_in_mitmweb_is_denied_though_the_cli_approved_it",
    ),
    HeldWrite(
        "mitmweb and the CLI decide at once",
        "the answer of the one applied",
        "the first the proxy sees; the other's transition (or decision) is refused by the store",
        "the write once, or nothing",
        _MA + "test_mitmweb_and_the_cli_deciding_at_once_exactly_one_wins",
        ("tests/store/test_approval_decisions.py::test_the_cli_and_mitmweb_racing_exactly_one_wins",),
    ),
    HeldWrite(
        "the proxy is killed (SIGKILL) while it is held",
        "(connection lost)",
        "`awaiting_approval` until a proxy starts on the database, then `not_sent`; `approve` / `deny` refuse "
        "it (its proxy `stopped`)",
        "nothing",
        _CE + "test_a_write_whose_proxy_is_gone_is_not_held_by_anyone",
    ),
]


def held_lines() -> list[str]:
    lines = [
        "## Writes held for approval",
        "",
        "A rule with `approve: true` holds each write until an operator decides, in mitmweb or with",
        "`receipts approve` / `receipts deny`. A held write is sent as it was recorded, or not at",
        "all ([Approvals](operations.md#approvals)).",
        "",
        "| while it is held | the agent gets | receipt | the upstream receives | shown by |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {h.what} | {h.agent_gets} | {h.receipt} | {h.sent} | `{h.test}`"
        + "".join(f", `{t}`" for t in h.also)
        + " |"
        for h in HELD_WRITES
    ]
    return [*lines, ""]


@pytest.mark.parametrize("row", HELD_WRITES, ids=lambda h: h.test.split("::")[-1])
def test_each_held_write_row_of_the_doc_names_a_test_that_exists(row):
    for test in row.tests():
        test_each_same_write_row_names_a_test_that_exists(SameWrite(row.what, "", "", test))


@pytest.fixture(scope="module")
def fault_upstream():
    with Upstream(hang_seconds=2.5) as up:
        yield up


@pytest.fixture(scope="module")
def untrusted_upstream(tmp_path_factory):
    """A TLS upstream whose certificate the proxy was not told to trust."""
    with Upstream(tls=True, certdir=tmp_path_factory.mktemp("untrusted-cert")) as up:
        yield up


def events(store, operation_id: str) -> list[tuple[str, str | None, str]]:
    return [(e.event, e.from_state, e.to_state) for e in store.events(operation_id)]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("fault", FAULTS, ids=[f.id for f in FAULTS])
def test_fault_matrix(fault: Fault, client: str, proxy, clients: Clients, fault_upstream, untrusted_upstream, bucket):
    cell(fault, client, proxy, clients, fault_upstream, untrusted_upstream, bucket)


@pytest.fixture(scope="module")
def pg_proxy(pg_cluster, tmp_path_factory, confdir, tls_upstream):
    """A proxy on PostgreSQL (a schema of this module's own on the session's server)."""
    from tests.e2e.processes import Proxy

    d = tmp_path_factory.mktemp("pg-proxy")
    p = Proxy(
        d,
        confdir,
        db=pg_cluster.new_schema(),
        upstream_ca=tls_upstream.cert_path,
        extra=("--set", f"receipts_secret={d / 'secret.key'}"),
    )
    p.start()
    yield p
    p.stop()


@pytest.mark.parametrize("fault", FAULTS, ids=[f.id for f in FAULTS])
def test_fault_matrix_on_postgresql(fault: Fault, pg_proxy, fault_upstream, untrusted_upstream, bucket):
    """Every fault once more, with one client, on a proxy whose receipts live in PostgreSQL."""
    cell(fault, "requests", pg_proxy, Clients(pg_proxy), fault_upstream, untrusted_upstream, bucket)


def cell(fault: Fault, client: str, proxy, clients: Clients, fault_upstream, untrusted_upstream, bucket) -> None:
    from proxy_addon.store import open_store as open_store

    if fault.id == "connection-refused":
        base, up = f"http://127.0.0.1:{free_port()}", None
    elif fault.id == "tls-handshake-failure":
        base, up = untrusted_upstream.url, untrusted_upstream
    else:
        base, up = fault_upstream.url, fault_upstream
    path = f"/api/{bucket}/plain"
    if fault.upstream:
        assert up is not None  # a fault the upstream plays needs an upstream
        up.plan(path, fault.upstream)
    timeout = 1.0 if fault.id == "commit-then-hang" else 10.0

    first = clients.send(client, "POST", base + path, {"title": fault.id}, timeout=timeout)
    assert first.status == fault.client_gets, first
    if fault.answer:
        assert first.json()["error"] == fault.answer
    if first.status is not None:
        assert first.headers["x-receipt-id"]

    def settled():
        store = open_store(proxy.db, create=False)
        try:
            rs = [r for r in store.list(limit=None) if bucket in r.target]
            return rs if rs and all(r.state != "submitted" for r in rs) else None
        finally:
            store.close()

    (receipt,) = wait_for(settled, timeout=15, what="the receipt's outcome")
    assert receipt.state == fault.state
    if up is not None:
        assert up.commits(path) == fault.commits

    retry = clients.send(client, "POST", base + path, {"title": fault.id}, timeout=10.0)
    assert retry.status == fault.retry_status, retry
    store = open_store(proxy.db, create=False)
    try:
        receipts = sorted((r for r in store.list(limit=None) if bucket in r.target), key=lambda r: r.submitted_at)
        first_events = events(store, receipt.operation_id)
        assert first_events[:2] == [("transition", None, "submitted"), ("transition", "submitted", fault.state)]
        if fault.retry == "forwarded":
            assert len(receipts) == 2
            assert receipts[1].retry_of == receipt.operation_id
            assert first_events[2:] == []
            if up is not None and fault.upstream:
                assert up.commits(path) == fault.commits + 1  # the retry went out, once
        else:
            assert len(receipts) == 1
            assert first_events[2:] == [
                ("replayed" if fault.retry == "replayed" else "blocked", fault.state, fault.state)
            ]
            assert retry.headers["x-receipt-id"] == receipt.operation_id
            if fault.retry == "replayed":
                assert retry.headers["x-receipt-replayed"] == "true"
                assert retry.body == first.body
            else:
                assert (retry.json()["error"], retry.json()["state"]) == ("duplicate_unresolved", fault.state)
            if up is not None:
                assert up.commits(path) == fault.commits  # never sent again
    finally:
        store.close()


@pytest.mark.parametrize("row", SAME_WRITE + NOT_SAME_WRITE, ids=lambda s: s.test.split("::")[-1])
def test_each_same_write_row_names_a_test_that_exists(row):
    """The doc cites tests by node id: each must name a test function, and a parameter id it really has."""
    import importlib

    path, _, name = row.test.partition("::")
    func_name, _, param = name.partition("[")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    func = getattr(module, func_name)
    if param:
        param = param[:-1]
        ids = []
        for mark in getattr(func, "pytestmark", []):
            if mark.name == "parametrize":
                given_ids = mark.kwargs.get("ids")
                values = mark.args[1]
                ids += (
                    list(given_ids)
                    if isinstance(given_ids, list)
                    else [v.id if getattr(v, "id", None) else str(v) for v in values]
                )
        assert param in ids, f"{row.test}: no parameter id {param!r} (ids: {ids})"


def test_guarantees_doc_matches_the_matrix():
    assert DOC.read_text() == render(), (
        "regenerate: .venv/bin/python -m tests.e2e.proxy.test_faults > docs/guarantees.md"
    )


if __name__ == "__main__":
    print(render(), end="")
