"""
`receipts export --signed` and `receipts verify BUNDLE`, on both backends: an untouched bundle verifies,
offline, by the CLI and by tests/proof_verifier.py (written from docs/proof.md, importing nothing
from proxy_addon); an edited one fails both.
"""

from __future__ import annotations

import json

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proxy_addon.cli import main
from proxy_addon.proof.signing_key import verifier_key
from proxy_addon.store import open_store
from tests import proof_verifier
from tests.cli.test_verify_command import history, signed
from tests.conftest import FakeClock


def export(db: str, capsys) -> list[str]:
    assert main(["--db", db, "export", "--signed"]) == 0
    return capsys.readouterr().out.splitlines(keepends=True)


def verify_bundle(path, capsys, *extra: str) -> tuple[int, str]:
    code = main(["verify", str(path), *extra])
    out = capsys.readouterr()
    return code, (out.out + out.err).strip()


def test_a_signed_export_verifies_offline_and_an_edit_shows(backend_db, tmp_path, capsys):
    store = open_store(backend_db, clock=FakeClock())
    try:
        history(store)
        signed(store, Ed25519PrivateKey.generate())
        history(store, 1, start=10)
        vkey = store.recorded_checkpoint_key()
    finally:
        store.close()
    lines = export(backend_db, capsys)
    kinds = [json.loads(line)["type"] for line in lines]
    assert kinds == ["bundle", "checkpoint", "mark"] + ["event"] * 12 + ["receipt"] * 4
    bundle = tmp_path / "bundle.jsonl"
    bundle.write_text("".join(lines))
    expected = "intact: 12 events, last checkpoint at 2026-03-01T12:00:00.000000Z (position 10)"
    assert verify_bundle(bundle, capsys) == (0, expected)
    assert verify_bundle(bundle, capsys, "--public-key", str(vkey)) == (0, expected)
    assert proof_verifier.verify(lines) == "intact: 12 events, 1 checkpoints"

    edited = [line.replace('"timed out"', '"HTTP 201"', 1) for line in lines]
    assert edited != lines
    bundle.write_text("".join(edited))
    code, line = verify_bundle(bundle, capsys)
    assert code == 1 and "its fields do not match its hash (edited)" in line, line
    assert proof_verifier.verify(edited).startswith("broken: position")

    other = Ed25519PrivateKey.generate()
    bundle.write_text("".join(lines))
    code, line = verify_bundle(bundle, capsys, "--public-key", verifier_key(other))
    assert code == 1 and "is not signed by the key" in line, line
    assert proof_verifier.verify(lines, verifier_key(other)).startswith("broken: a checkpoint")


def test_not_a_bundle(tmp_path, capsys):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"type": "receipt"}\n')
    code, line = verify_bundle(bad, capsys)
    assert code == 1 and "not a receipt-proxy-proof/1 bundle" in line, line


def decided_history(store) -> dict[str, str]:
    """Receipts with decisions applied: a rule's deny, a budget's refusal, an approval from the CLI, observe
    mode's would_block (and duplicate_sent on the first), a resolution by hand."""
    import dataclasses

    from proxy_addon.states import State
    from proxy_addon.store.records import Charge
    from tests.cli.test_verify_command import attempt

    one = Charge("k/budget[0]/86400s/count", 1, 86400, 1, "budget[0]: 1 write per 1d")
    ids = {"denied": store.begin_attempt(dataclasses.replace(attempt(20), denied="decisions[0]")).receipt.operation_id}
    store.begin_attempt(dataclasses.replace(attempt(21), charges=(one,)))
    ids["over_budget"] = store.begin_attempt(dataclasses.replace(attempt(22), charges=(one,))).receipt.operation_id
    held = store.begin_attempt(dataclasses.replace(attempt(23), approval=True)).receipt.operation_id
    d = store.decide_approval(held, approve=True, note="ok", actor="cli:alice")
    store.apply_approval(d, fingerprint=d.intent_fingerprint, reason="approved by operator: ok")
    ids["approved"] = held
    first = store.begin_attempt(dataclasses.replace(attempt(24), observe=True)).receipt.operation_id
    ids["would_block"] = store.begin_attempt(dataclasses.replace(attempt(24), observe=True)).receipt.operation_id
    ids["duplicate_sent"] = first
    store.transition(held, State.OUTCOME_UNKNOWN, reason="timed out")
    store.resolve(held, State.SUCCEEDED, note="on the dashboard", actor="cli:bob")
    return ids


def test_both_exports_carry_each_receipts_decisions_and_the_signed_one_still_verifies(backend_db, tmp_path, capsys):
    store = open_store(backend_db, clock=FakeClock())
    try:
        ids = decided_history(store)
        signed(store, Ed25519PrivateKey.generate())
    finally:
        store.close()
    lines = export(backend_db, capsys)
    items = [json.loads(line) for line in lines]
    signed_decisions = {i["receipt"]["operation_id"]: i["decisions"] for i in items if i["type"] == "receipt"}
    events = {i["record"]["id"]: i["record"] for i in items if i["type"] == "event"}
    assert main(["--db", backend_db, "export"]) == 0
    plain = {r["operation_id"]: r["decisions"] for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert signed_decisions == plain
    kinds = {name: [d["kind"] for d in plain[i]] for name, i in ids.items()}
    assert kinds == {
        "denied": ["denied_by_rule"],
        "over_budget": ["over_budget"],
        "approved": ["held", "approved", "review", "resolved"],
        "would_block": ["would_block"],
        "duplicate_sent": ["duplicate_sent"],
    }
    assert [d["by"] for d in plain[ids["approved"]]] == ["proxy", "cli:alice", "cli:bob", "cli:bob"]
    for operation_id, decisions in plain.items():  # each names its event, in the chain the bundle holds
        for d in decisions:
            e = events[d["event_id"]]
            assert (e["operation_id"], e["at"], e["actor"], e["reason"]) == (operation_id, d["at"], d["by"], d["why"])
    bundle = tmp_path / "bundle.jsonl"
    bundle.write_text("".join(lines))
    code, line = verify_bundle(bundle, capsys)
    assert code == 0 and line.startswith("intact: "), line
    assert proof_verifier.verify(lines).startswith("intact: ")
