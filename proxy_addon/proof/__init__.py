"""
Receipts you can prove: the events' hash chain and its signed checkpoints, as pure functions
(no SQL, no I/O but a key file): docs/proof.md is their specification.

    jcs.py               RFC 8785 (JCS) canonical JSON, for the values events hold
    chain_links.py       an event's (or a chain mark's) canonical form and hash
    chain_audit.py       walking a chain in order: the first record that breaks it, and why
    chain_verdict.py     the verdict on a history, from its checkpoints, records and receipts
    checkpoint_notes.py  signed checkpoints as C2SP signed-note-style text (Ed25519)
    signing_key.py       the installation's Ed25519 checkpoint key, a file beside secret.key
    bundle_lines.py      `receipts export --signed` bundles: JSON Lines, written, and verified by `verify BUNDLE`
"""
