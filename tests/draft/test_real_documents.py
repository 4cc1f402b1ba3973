"""
Rules drafted from real OpenAPI documents that nobody here wrote (Resend, SendGrid's mail send and
contacts, Slack's Web API: tests/openapi/): each draft loads as written, `receipts rules check` passes
with its TODOs as warnings, `receipts rules explain` reads a request of it, and it holds what our shipped
pack for that API says: every write the pack names is in the draft with the same method and path template.
The domain's rules hold in every draft: no 409 is a refusal, no secret-looking field enters a fingerprint.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from proxy_addon import explain
from proxy_addon.cli import main
from proxy_addon.draft import draft_openapi, read_document, write_draft
from proxy_addon.outcome.classify import answer_outcome, classify_status
from proxy_addon.rules import RuleSet, check_rules, load_rules, load_rules_path
from proxy_addon.states import State
from proxy_addon.wire.redaction import is_secret_name
from tests.draft.conftest import ROOT, document

# document → the shipped pack of its API
DOCUMENTS = {
    "resend.yaml": "resend.yaml",
    "sendgrid-mail-v3.yaml": "sendgrid.yaml",
    "sendgrid-contactdb-v3.yaml": "sendgrid.yaml",
    "slack-web-openapi-v2.json": "slack.yaml",
}
_drafts: dict[str, str] = {}


def draft_text(name: str) -> str:
    if name not in _drafts:
        _drafts[name] = write_draft(draft_openapi(read_document(document(name))))
    return _drafts[name]


@pytest.mark.parametrize("name", DOCUMENTS)
def test_the_draft_loads_as_written_and_rules_check_passes_with_its_todos_as_warnings(name, tmp_path, capsys):
    text = draft_text(name)
    assert check_rules(text, source=name) == []
    rules = load_rules(text, source=name)
    assert rules.operations
    path = tmp_path / f"{rules.api}.yaml"
    path.write_text(text)
    assert main(["rules", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert f"ok  {path}: {len(rules.operations)} operations" in out
    todos = re.findall(rf"^warning: {re.escape(str(path))}:\d+: TODO: (.*)$", err, re.M)
    assert len(todos) == text.count("# TODO:") > 0
    assert all("#/" in todo for todo in todos if "(the file's head)" not in todo)  # each names where it looked


@pytest.mark.parametrize("name", DOCUMENTS)
def test_every_write_of_the_shipped_pack_is_in_the_draft(name):
    """Same method and path template; the counts of extra and missing operations are printed (pytest -s)."""
    draft = load_rules(draft_text(name), source=name)
    pack = load_rules_path(ROOT / "rules" / DOCUMENTS[name]).files[0]
    doc = read_document(document(name))
    described = {doc.base_path + op.path for op in doc.operations}
    drafted = {(op.method, op.path.template) for op in draft.operations}
    pack_writes = {(op.method, op.path.template) for op in pack.operations}
    missing = pack_writes - drafted
    print(
        f"\n{name} vs rules/{DOCUMENTS[name]}: pack writes {len(pack_writes)}, in the draft "
        f"{len(pack_writes & drafted)}, missing {len(missing)} {sorted(missing)}, extra {len(drafted - pack_writes)}"
    )
    # a pack write whose path this document describes is in its draft
    assert {(m, p) for m, p in missing if p in described} == set()


def test_every_write_of_each_pack_is_in_the_drafts_of_its_api():
    by_pack: dict[str, set] = {}
    for name, pack in DOCUMENTS.items():
        by_pack.setdefault(pack, set()).update(
            (op.method, op.path.template) for op in load_rules(draft_text(name), source=name).operations
        )
    for pack, drafted in by_pack.items():
        writes = {(op.method, op.path.template) for op in load_rules_path(ROOT / "rules" / pack).operations}
        assert writes <= drafted, pack


def test_resend_post_emails_has_the_idempotency_key_header():
    rules = RuleSet.of([load_rules(draft_text("resend.yaml"), source="resend")])
    m = rules.match("api.resend.com", 443, "POST", "/emails")
    assert m is not None
    assert m.operation.idempotency_header == "Idempotency-Key"
    assert m.operation.name == "emails.send"
    assert m.operation.external_id == "id"
    assert m.operation.reconcile is not None and m.operation.reconcile.url.startswith("/emails?limit=")
    assert m.operation.reconcile.absence_provable is False


def test_slack_chat_post_message_is_a_write_and_conversations_list_is_not():
    rf = load_rules(draft_text("slack-web-openapi-v2.json"), source="slack")
    rules = RuleSet.of([rf])
    m = rules.match("slack.com", 443, "POST", "/api/chat.postMessage")
    assert m is not None and m.operation.name == "chat.postMessage"
    assert {"channel", "text"} <= set(m.operation.fingerprint.body or ())
    for read in ("/api/conversations.list", "/api/conversations.history", "/api/users.info"):
        assert rules.match("slack.com", 443, "POST", read) is None
        assert rules.match("slack.com", 443, "GET", read) is None
        assert any(t.match(read) is not None for t in rf.post_reads)
    # Slack answers 200 {"ok": false}: an error is never a success, nor a refusal, until the user sorts it
    body = json.dumps({"ok": False, "error": "channel_not_found"}).encode()
    assert answer_outcome(200, "", {}, body, m.operation).state == State.OUTCOME_UNKNOWN
    assert answer_outcome(200, "", {}, b'{"ok": true, "ts": "1.2"}', m.operation).state == State.SUCCEEDED


def test_slack_with_writes_names_only_the_methods_it_matches():
    draft = draft_openapi(
        read_document(document("slack-web-openapi-v2.json")), writes=re.compile(r"^chat\.(postMessage|update)$")
    )
    rf = load_rules(write_draft(draft), source="slack")
    assert sorted(op.name for op in rf.operations) == ["chat.postMessage", "chat.update"]
    assert any(t.match("/api/chat.delete") is not None for t in rf.post_reads)  # not matched: a read, as the user said


@pytest.mark.parametrize("name", DOCUMENTS)
def test_no_409_is_ever_a_refusal(name):
    rf = load_rules(draft_text(name), source=name)
    for op in rf.operations:
        assert classify_status(409, op) != State.REJECTED, op.name
        for body in (b"", b'{"ok": false, "error": "already_exists"}', b'{"message": "conflict"}'):
            assert answer_outcome(409, "", {}, body, op).state != State.REJECTED, op.name


@pytest.mark.parametrize("name", DOCUMENTS)
def test_no_secret_looking_field_enters_a_fingerprint(name):
    rf = load_rules(draft_text(name), source=name)
    for op in rf.operations:
        for field in (*(op.fingerprint.body or ()), *op.fingerprint.query, *op.fingerprint.headers):
            assert not any(is_secret_name(part) for part in field.split(".")), (op.name, field)


def test_explain_reads_a_request_of_each_draft(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RECEIPT_PROXY_DB", raising=False)
    cases = {
        "resend.yaml": (
            "POST",
            "https://api.resend.com/emails",
            {"from": "a@x.test", "to": "b@y.test", "subject": "s"},
        ),
        "sendgrid-mail-v3.yaml": ("POST", "https://api.sendgrid.com/v3/mail/send", {"subject": "s"}),
        "slack-web-openapi-v2.json": ("POST", "https://slack.com/api/chat.postMessage", {"channel": "C1", "text": "t"}),
    }
    for name, (method, url, body) in cases.items():
        rules = RuleSet.of([load_rules(draft_text(name), source=name)])
        report = explain.explain(
            rules, method, url, json.dumps(body).encode(), {"content-type": "application/json"}, os.urandom(32)
        )
        assert report["match"]["operation"], name
        assert report["fingerprint"]["value"].startswith("sha256:")
        assert "fingerprint:" in explain.render(report)


def test_rules_explain_on_a_drafted_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RECEIPT_PROXY_DB", raising=False)
    path = tmp_path / "resend.yaml"
    path.write_text(draft_text("resend.yaml"))
    body = tmp_path / "b.json"
    body.write_text('{"from": "a@x.test", "to": "b@y.test", "subject": "hi", "html": "<p>1</p>"}')
    assert (
        main(["rules", "explain", "POST", "https://api.resend.com/emails", "--body", str(body), "--rules", str(path)])
        == 0
    )
    out = capsys.readouterr().out
    assert "operation: resend emails.send" in out
    assert "the proxy adds Idempotency-Key" in out
