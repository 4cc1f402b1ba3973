"""
`receipts rules draft --flows` on traffic written here: paths clustered into templates (ids, UUIDs,
numbers and slugs that vary become parameters; a last literal that varies stays two operations),
fingerprint fields proposed from retries and distinct writes (a field that changed in a retry is
left out, a secret is never in it nor shown), HAR files and request shape lines read (a bad one
refused, naming where), writes to several hosts refused without --host, and every draft loads
and explains.
"""

from __future__ import annotations

import json
import re

import pytest

from proxy_addon.cli import main
from proxy_addon.draft import write_draft
from proxy_addon.draft.flows_draft import draft_flows, find_fields, retry_of
from proxy_addon.draft.path_clusters import cluster_paths, id_like
from proxy_addon.draft.request_shapes import (
    RequestShape,
    hmac_token,
    read_har,
    read_shape_lines,
    shape_line,
    shape_of,
)
from proxy_addon.errors import DraftError
from proxy_addon.rules import check_rules, load_rules
from proxy_addon.rules.todo_comments import todos_in
from tests.conftest import SECRETS

HOST = "api.shop.test"


def templates(paths, method="POST"):
    clusters = cluster_paths((method, HOST, p) for p in paths)
    return {p: clusters[(method, HOST, p)].template for p in paths}


@pytest.mark.parametrize(
    ("segment", "is_id"),
    [
        ("123", True),
        ("550e8400-e29b-41d4-a716-446655440000", True),
        ("5f8d0d55b54764421b7156c3", True),
        ("ord_8f3k2m", True),
        ("{id}", True),
        ("orders", False),
        ("v1", False),
        ("v2.1", False),
        ("2024-01-01", False),
        ("chat.postMessage", False),
    ],
)
def test_what_looks_like_an_id(segment, is_id):
    assert id_like(segment) is is_id


def test_ids_uuids_numbers_and_slugs_become_parameters():
    got = templates(
        [
            "/v1/orders/ord_8f3k2m/refunds",
            "/v1/orders/ord_q9x1z7/refunds",
            "/v1/emails",
            "/v1/contacts",
            "/repos/alice/tools/issues",
            "/repos/bob/site/issues",
            "/v1/emails/550e8400-e29b-41d4-a716-446655440000/cancel",
        ]
    )
    assert (
        got["/v1/orders/ord_8f3k2m/refunds"]
        == got["/v1/orders/ord_q9x1z7/refunds"]
        == ("/v1/orders/{order_id}/refunds")
    )
    assert got["/v1/emails"] == "/v1/emails" and got["/v1/contacts"] == "/v1/contacts"  # two operations
    assert got["/repos/alice/tools/issues"] == got["/repos/bob/site/issues"] == "/repos/{repo_id}/{repo_id_2}/issues"
    assert got["/v1/emails/550e8400-e29b-41d4-a716-446655440000/cancel"] == "/v1/emails/{email_id}/cancel"


def test_methods_are_clustered_apart():
    clusters = cluster_paths([("POST", HOST, "/v1/things"), ("DELETE", HOST, "/v1/things/12")])
    assert clusters[("POST", HOST, "/v1/things")] is not clusters[("DELETE", HOST, "/v1/things/12")]


def shape(path="/v1/orders", status=201, time=0.0, **fields):
    return RequestShape(method="POST", host=HOST, path=path, status=status, time=time, fields=fields)


def test_a_retry_is_a_failed_attempts_near_copy_to_the_same_path():
    a = shape(status=500, time=0.0, sku='"a"', qty="1", request_id='"r1"')
    b = shape(status=201, time=2.0, sku='"a"', qty="1", request_id='"r2"')  # its retry: 2 of 3 alike
    c = shape(status=201, time=3.0, sku='"b"', qty="2", request_id='"r3"')  # a new write
    far = shape(status=201, time=9999.0, sku='"b"', qty="2", request_id='"r4"')  # after the window: new
    assert retry_of([a, b, c, far]) == [None, 0, None, None]
    ok_first = shape(status=201, time=0.0, sku='"a"', qty="1", request_id='"r1"')
    assert retry_of([ok_first, b]) == [None, None]  # after a success: a new write, however alike
    other_path = shape(path="/v1/orders/x", status=None, time=0.0, sku='"a"', qty="1", request_id='"r1"')
    assert retry_of([other_path, b]) == [None, None]


def test_fields_that_change_in_a_retry_are_left_out_and_those_that_tell_writes_apart_go_in():
    attempts = [
        shape(status=None, time=0.0, sku='"a"', qty="1", request_id='"r1"', password=None),
        shape(status=201, time=1.0, sku='"a"', qty="1", request_id='"r2"', password=None),
        shape(status=201, time=5.0, sku='"b"', qty="1", request_id='"r3"', password=None),
    ]
    found = find_fields(attempts)
    assert (found.attempts, found.writes, found.retries) == (3, 2, 1)
    assert found.varying == ["sku"] and found.constant == ["qty"]
    assert found.volatile == ["request_id"] and found.secret == ["password"]
    d = draft_flows(attempts, source="t")
    assert d.operations[0].fingerprint == {"body": ["sku", "qty"]}


def har(entries):
    return {"log": {"version": "1.2", "entries": entries}}


def entry(method, url, body, status, second, ctype="application/json"):
    text = json.dumps(body) if ctype == "application/json" else body
    return {
        "startedDateTime": f"2026-01-01T00:00:{second:02d}.000Z",
        "request": {
            "method": method,
            "url": url,
            "headers": [
                {"name": "Authorization", "value": SECRETS["authorization"]},
                {"name": "api-key", "value": SECRETS["api-key"]},
                {"name": "Idempotency-Key", "value": f"k{second}"},
                {"name": "Content-Type", "value": ctype},
            ],
            "postData": {"mimeType": ctype, "text": text},
        },
        "response": {"status": status},
    }


SESSION = [
    entry("POST", f"https://{HOST}/v1/orders", {"sku": "a", "qty": 1, "nonce": "n1", "client_secret": "s1"}, 201, 1),
    entry(
        "POST",
        f"https://{HOST}/v1/orders?token={SECRETS['token']}",
        {"sku": "b", "qty": 2, "nonce": "n2", "client_secret": SECRETS["blob"]},
        503,
        2,
    ),
    entry("POST", f"https://{HOST}/v1/orders", {"sku": "b", "qty": 2, "nonce": "n3", "client_secret": "s3"}, 201, 3),
    entry(
        "POST",
        f"https://{HOST}/v1/orders/ord_8f3k2m/refunds",
        "amount=5&reason=dup",
        0,
        4,
        "application/x-www-form-urlencoded",
    ),
    entry(
        "POST",
        f"https://{HOST}/v1/orders/ord_9x3k2m/refunds",
        "amount=7&reason=dup",
        201,
        5,
        "application/x-www-form-urlencoded",
    ),
    entry("GET", f"https://{HOST}/v1/orders", None, 200, 6),
]


def test_a_har_session_drafts_rules_that_load_and_keep_its_secrets_out(tmp_path):
    path = tmp_path / "session.har"
    path.write_text(json.dumps(har(SESSION)))
    shapes = read_har(path)
    assert [s.method for s in shapes] == ["POST"] * 5  # the GET is no write
    assert shapes[3].status is None  # HAR's 0: no answer
    text = write_draft(draft_flows(shapes, source=str(path)))
    rules = load_rules(text, source="draft")
    ops = {(op.method, op.path.template): op for op in rules.operations}
    orders = ops[("POST", "/v1/orders")]
    assert orders.fingerprint.body == ("sku", "qty")  # nonce changed in the retry; client_secret a secret
    refunds = ops[("POST", "/v1/orders/{order_id}/refunds")]
    assert refunds.fingerprint.body == ("amount", "reason")
    assert orders.idempotency_header == "Idempotency-Key"
    assert "# seen: 3 requests: 2 distinct writes and 1 retries; statuses: 201 ×2, 503 ×1" in text
    assert 'e.g. sku="a", qty=1' in text
    assert "api-key" in text and "Authorization" in text  # the credential headers' names
    for secret in SECRETS.values():
        assert secret not in text
    assert "s1" not in text and "client_secret" in text  # named, never shown
    assert check_rules(text, source="draft") == []
    assert todos_in(text)  # what traffic cannot say


def test_the_cli_drafts_from_a_har_and_explain_works_on_it(tmp_path, capsys):
    path = tmp_path / "session.har"
    path.write_text(json.dumps(har(SESSION)))
    assert main(["rules", "draft", "--flows", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "drafted 2 operations" in err
    rules = tmp_path / "draft.yaml"
    rules.write_text(out)
    assert main(["rules", "check", str(rules)]) == 0
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"sku": "z", "qty": 3, "nonce": "n9"}))
    capsys.readouterr()
    assert (
        main(["rules", "explain", "POST", f"https://{HOST}/v1/orders", "--body", str(body), "--rules", str(rules)]) == 0
    )
    explained = capsys.readouterr().out
    assert 'body.sku = "z"' in explained and "nonce" not in explained


def test_writes_to_several_hosts_need_a_host(tmp_path, capsys):
    path = tmp_path / "two.har"
    path.write_text(json.dumps(har([SESSION[0], entry("POST", "https://api.other.test/v2/things", {"a": 1}, 201, 9)])))
    assert main(["rules", "draft", "--flows", str(path)]) == 1
    assert "several hosts (api.shop.test (1), api.other.test (1)): give --host" in capsys.readouterr().err
    assert main(["rules", "draft", "--flows", str(path), "--host", "api.other.test"]) == 0
    assert "path: /v2/things" in capsys.readouterr().out
    assert main(["rules", "draft", "--flows", str(path), "--host", "nowhere.test"]) == 1
    assert "no write to nowhere.test" in capsys.readouterr().err


def test_a_file_that_is_no_traffic_is_refused_naming_it(tmp_path, capsys):
    bad = tmp_path / "bad.har"
    bad.write_text('{"log": {"entries": [{"request": {"method": "POST"}}]}}')
    assert main(["rules", "draft", "--flows", str(bad)]) == 1
    assert f"{bad}: log.entries[0]: not a HAR request" in capsys.readouterr().err
    noise = tmp_path / "noise.bin"
    noise.write_bytes(b"\x00\x01 not a flow file at all")
    assert main(["rules", "draft", "--flows", str(noise)]) == 1
    assert "not a HAR, receipts_learn or mitmproxy flow file" in capsys.readouterr().err


def test_shape_lines_keep_names_and_hashes_only():
    token = hmac_token(b"k" * 32)
    body = json.dumps({"title": "Hello", "meta": {"tag": "x"}, "api_key": SECRETS["api-key"], "text": "Hello"}).encode()
    headers = [("Authorization", SECRETS["authorization"]), ("Content-Type", "application/json")]
    s = shape_of("post", f"https://{HOST}:8443/v1/notes?token={SECRETS['token']}", headers, body, 201, 1.0, token)
    assert s.host == f"{HOST}:8443" and s.query == ("token",) and s.credential_headers == ("Authorization",)
    assert s.fields["api_key"] is None and s.fields["title"] == s.fields["text"]  # equal values, equal hashes
    assert set(s.fields) == {"title", "meta.tag", "api_key", "text"}
    line = shape_line(s)
    assert "Hello" not in line and all(v not in line for v in SECRETS.values())
    (back,) = read_shape_lines([line], "learn.jsonl")
    assert back == s
    with pytest.raises(DraftError, match=r"learn.jsonl: line 2: not a request shape line"):
        list(read_shape_lines([line, '{"kind": "other"}'], "learn.jsonl"))


def test_a_learn_file_drafts_without_example_values(tmp_path, capsys):
    token = hmac_token(b"k" * 32)
    lines = []
    for i, (title, status) in enumerate([("a", 500), ("a", 201), ("b", 201)]):
        body = json.dumps({"title": title, "sent_at": i}).encode()
        s = shape_of("POST", f"https://{HOST}/v1/notes", [("content-type", "application/json")], body, status, i, token)
        lines.append(shape_line(s))
    path = tmp_path / "learn.jsonl"
    path.write_text("\n".join(lines) + "\n" + lines[0][:40])  # a proxy still writing: its last line half there
    assert main(["rules", "draft", "--flows", str(path)]) == 0
    out = capsys.readouterr().out
    assert "3 requests" in out
    assert "body: [title]" in out and "sent_at" in out  # named as left out
    assert "; e.g. " not in out and not re.search(r"h:[0-9a-f]{32}", out)


def test_writes_is_for_openapi_only(tmp_path, capsys):
    path = tmp_path / "session.har"
    path.write_text(json.dumps(har(SESSION)))
    assert main(["rules", "draft", "--flows", str(path), "--writes", "post"]) == 1
    assert "--writes is for --openapi" in capsys.readouterr().err
