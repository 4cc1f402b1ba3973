"""Checkpoint notes (C2SP signed-note style): what they sign opens only with the key that signed it, unaltered."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proxy_addon.proof.checkpoint_notes import NoteError, open_checkpoint, sign_checkpoint
from proxy_addon.proof.signing_key import load_or_create_signing_key, parse_verifier_key, verifier_key

HEAD = "ab" * 32
TIME = "2026-12-01T10:00:00.000000Z"


def test_a_note_opens_with_its_key_and_says_what_it_signed():
    key = Ed25519PrivateKey.generate()
    note = sign_checkpoint(key, 1234, HEAD, TIME)
    assert note.startswith("receipt-proxy/events\n1234\nq6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s=\ntime ")
    assert "\n\n\u2014 receipt-proxy " in note
    head = open_checkpoint(note, verifier_key(key))
    assert (head.size, head.head, head.time) == (1234, HEAD, TIME)


def test_an_altered_note_or_another_key_is_refused():
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    note = sign_checkpoint(key, 10, HEAD, TIME)
    with pytest.raises(NoteError, match="does not verify: the note was altered"):
        open_checkpoint(note.replace("\n10\n", "\n11\n"), verifier_key(key))
    with pytest.raises(NoteError, match="not signed by the key receipt-proxy"):
        open_checkpoint(sign_checkpoint(other, 10, HEAD, TIME), verifier_key(key))
    with pytest.raises(NoteError, match="not a signed note"):
        open_checkpoint("receipt-proxy/events\n10\n", verifier_key(key))


def test_the_key_file_is_made_once_private_and_its_verifier_key_checks_itself(tmp_path):
    path = tmp_path / "state" / "checkpoint.key"
    key = load_or_create_signing_key(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert verifier_key(load_or_create_signing_key(path)) == verifier_key(key)
    name, ident, _ = parse_verifier_key(verifier_key(key))
    assert name == "receipt-proxy" and len(ident) == 4
    forged = verifier_key(key).split("+", 2)  # base64 may hold a "+" too
    with pytest.raises(ValueError, match="id"):
        parse_verifier_key(f"{forged[0]}+00000000+{forged[2]}")
    (tmp_path / "bad.key").write_text("not a key")
    with pytest.raises(ValueError, match="not an Ed25519 private key"):
        load_or_create_signing_key(tmp_path / "bad.key")
