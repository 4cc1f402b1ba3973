"""The checkpoint signer (gate/checkpoint_signer.py): every N records, or T seconds, and once more at the end."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proxy_addon.cli.verify_command import audit_store
from proxy_addon.gate.checkpoint_signer import CheckpointSigner
from proxy_addon.proof.signing_key import verifier_key
from proxy_addon.store import open_store
from tests.cli.conftest import attempt
from tests.conftest import wait_for


def test_signs_every_n_records_and_at_the_end(backend_db):
    key = Ed25519PrivateKey.generate()
    store = open_store(backend_db)
    store.check_checkpoint_key(verifier_key(key))
    signer = CheckpointSigner(backend_db, key, every_events=3, every_seconds=3600)
    try:
        assert not signer.sign()  # position 1 (where the chain starts): not 3 records yet
        store.begin_attempt(attempt(1))
        store.begin_attempt(attempt(2))
        assert signer.sign()  # 3 records
        store.begin_attempt(attempt(3))
        assert not signer.sign()
        signer.start()
        store.begin_attempt(attempt(4))
        store.begin_attempt(attempt(5))
        wait_for(lambda: len(store.checkpoints()) == 2, what="the signer's thread to sign at 6 records")
        store.begin_attempt(attempt(6))
    finally:
        signer.stop()  # signs the tip once more
    try:
        assert [c["size"] for c in store.checkpoints()] == [3, 6, 7]
        assert audit_store(store).line().startswith("intact: 6 events, last checkpoint at ")
    finally:
        store.close()
