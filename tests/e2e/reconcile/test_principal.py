"""
A read from the CLI carries the write's own credentials, or it is not made: credentials of
another key or account could look in the wrong place and "prove" the write absent (a read
without Stripe-Account looks in the platform account). The upstream counts reads and writes.
"""

from __future__ import annotations

from proxy_addon.cli import main
from proxy_addon.store import Store
from tests.conftest import SECRETS, TEST_RULES
from tests.e2e.reconcile.test_reconcile import unknown_write


def state_of(proxy, operation_id: str) -> str:
    store = Store.open(proxy.db, create=False)
    try:
        return str(store.get(operation_id).state)
    finally:
        store.close()


def test_a_read_with_another_accounts_credentials_is_refused(clients, proxy, upstream, bucket, capsys):
    path = f"/api/{bucket}/things"
    r = unknown_write(clients, proxy, upstream, bucket, "things", {"title": "mine"}, "lost")  # never executed
    argv = ["--db", str(proxy.db), "reconcile", r.operation_id, "--rules", str(TEST_RULES)]
    capsys.readouterr()
    assert main([*argv, "--header", "api-key: SOMEONE-ELSES-KEY"]) == 1
    err = capsys.readouterr().err
    assert f"{r.operation_id} not read: the credentials given are not those the write was sent with" in err
    assert "SOMEONE-ELSES-KEY" not in err
    assert upstream.reads(path) == 0 and state_of(proxy, r.operation_id) == "outcome_unknown"
    # The write's own key (the agent sent it as api-key): the read is made and proves it absent.
    assert main([*argv, "--header", f"api-key: {SECRETS['api-key']}"]) == 0
    assert upstream.reads(path) == 1 and state_of(proxy, r.operation_id) == "safe_to_retry"
    assert upstream.commits(path) == 0  # a read, never a write
