"""
Receipts you can prove, in a fleet: two real mitmdump proxies on one PostgreSQL (the session's
throwaway server), 40 distinct writes sent to both at once, checkpoints signed every 5 records
by both with the fleet's one checkpoint.key. The untouched export verifies, by `receipts verify`
and by tests/proof_verifier.py; the chain's ids follow its order though the proxies wrote at once.
"""

from __future__ import annotations

import threading

import pytest

from proxy_addon.cli import main
from proxy_addon.store import open_store
from tests import proof_verifier
from tests.e2e.processes import Clients, start_all
from tests.e2e.store.test_fleet import instance

pytestmark = pytest.mark.e2e


def test_an_untouched_export_of_a_busy_fleet_verifies(pg_url, tmp_path, confdir, upstream, bucket, capsys):
    key = tmp_path / "fleet-secret.key"
    every = ("--set", "receipts_checkpoint_events=5", "--set", "receipts_checkpoint_seconds=1")
    proxies = start_all([instance(pg_url, tmp_path, confdir, key, *every) for _ in range(2)])
    results: list = [None] * 40
    try:
        barrier = threading.Barrier(40)

        def send(i: int) -> None:
            barrier.wait(timeout=20)
            url = f"{upstream.url}/api/{bucket}/plain"
            results[i] = Clients(proxies[i % 2]).send("requests", "POST", url, {"title": f"n{i}"}, timeout=40)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert [r.status for r in results] == [201] * 40
    finally:
        for p in proxies:
            p.stop()  # each signs the tip once more as it stops
    assert (tmp_path / "checkpoint.key").exists()  # beside the fleet's secret key: one key for both
    store = open_store(pg_url, create=False)
    try:
        ids = [r["id"] for r in store._rows("SELECT id FROM receipt_events ORDER BY chain_seq")]
        assert ids == sorted(ids) and len(ids) == 80  # each write: new, then its outcome
        size, _ = store.chain_tip()
        assert [c["size"] for c in store.checkpoints()][-1] == size  # the last stop signed the tip
    finally:
        store.close()
    assert main(["--db", pg_url, "export", "--signed"]) == 0
    lines = capsys.readouterr().out.splitlines(keepends=True)
    bundle = tmp_path / "fleet.jsonl"
    bundle.write_text("".join(lines))
    assert main(["verify", str(bundle)]) == 0
    assert capsys.readouterr().out.startswith("intact: 80 events, last checkpoint at ")
    assert main(["verify", "--db", pg_url]) == 0
    assert proof_verifier.verify(lines).startswith("intact: 80 events, ")
