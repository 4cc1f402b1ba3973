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
