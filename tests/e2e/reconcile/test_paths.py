"""
One reconcile, two callers: the proxy (a duplicate arrives at a real mitmdump) and the
`receipts reconcile` CLI take the same branches, record the same verdicts, and never leave
a receipt in `reconciling`, whatever the read answers. The upstream counts reads and writes.
"""

from __future__ import annotations

import time

import pytest

from proxy_addon.cli import main
from proxy_addon.store import Store
from tests.conftest import TEST_RULES
from tests.e2e.processes import Proxy
from tests.e2e.reconcile.test_reconcile import receipts_for, unknown_write

CALLERS = ["proxy", "cli"]


def reconcile_by(
    caller: str, clients, proxy: Proxy, upstream, bucket: str, kind: str, body: dict, capsys, *argv: str
) -> tuple[str, str, str, int | None, str]:
    """Reconcile the one outcome_unknown receipt of `kind` by `caller`; its state, last reason, actor,
    the CLI's exit status (None for the proxy) and what the CLI said on stderr."""
    (receipt,) = [r for r in receipts_for(proxy, bucket, kind) if r.state == "outcome_unknown"]
    code, err = None, ""
    if caller == "proxy":
        dup = clients.send("httpx", "POST", f"{upstream.url}/api/{bucket}/{kind}", body)
        assert dup.status in (409, 201, 200), dup.body
    else:
        capsys.readouterr()
        code = main(["--db", str(proxy.db), "reconcile", receipt.operation_id, "--rules", str(TEST_RULES), *argv])
        err = capsys.readouterr().err
    store = Store.open(proxy.db, create=False)
    try:
        after = store.get(receipt.operation_id)
        last = [e for e in store.events(receipt.operation_id) if e.event == "transition"][-1]
    finally:
        store.close()
    return str(after.state), last.reason, last.actor, code, err


# kind, the write's body, the read's fault (None: answers normally), seconds to wait before
# reconciling, then the expected state, a fragment of the verdict's reason, and how many GETs.
BRANCHES = [
    pytest.param(
        "things", {"title": "here"}, "item", None, 0, "succeeded", "found among 1 items (id=1)", 1, id="read-finds-it"
    ),
    pytest.param(
        "things",
        {"title": "gone"},
        None,
        None,
        0,
        "safe_to_retry",
        "absence is proven and the rule allows a retry",
        1,
        id="read-proves-absence",
    ),
    pytest.param(
        "payments",
        {"amount": 5, "customer": "c"},
        None,
        None,
        0,
        "safe_to_retry",
        "the API deduplicates by Idempotency-Key; sending again with the same key",
        0,
        id="key-dedupes-no-read",
    ),
    pytest.param(
        "charges",
        {"amount": 7},
        None,
        None,
        0,
        "safe_to_retry",
        "the API deduplicates by Idempotency-Key",
        0,
        id="key-within-its-ttl",
    ),
    pytest.param(
        "charges",
        {"amount": 8},
        None,
        None,
        1.2,
        "manual_review",
        "the API forgets Idempotency-Key keys after 1s and no read is configured",
        0,
        id="key-past-its-ttl",
    ),
]


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("kind, body, existing, fault, wait, state, reason, gets", BRANCHES)
def test_both_callers_take_the_same_branch(
    caller, clients, proxy, upstream, bucket, capsys, kind, body, existing, fault, wait, state, reason, gets
):
    path = f"/api/{bucket}/{kind}"
    unknown_write(clients, proxy, upstream, bucket, kind, body, "lost" if existing is None else "drop")
    time.sleep(wait)  # bounded: an idempotency key's ttl of 1 s
    if caller == "proxy" and state == "manual_review":
        # The proxy reconciles only what it can settle now: a key past its ttl with no read is left
        # outcome_unknown for a person (or the CLI, which records the verdict), and the duplicate is blocked.
        state, reason = "outcome_unknown", "upstream"
    got_state, got_reason, actor, code, _ = reconcile_by(caller, clients, proxy, upstream, bucket, kind, body, capsys)
    assert (got_state, reason in got_reason) == (state, True), got_reason
    if got_state != "outcome_unknown":  # settled by this caller's reconcile
        assert actor == "proxy (inline reconcile)" if caller == "proxy" else actor.startswith("cli")
    assert upstream.reads(path) == gets
    # A read, never another write; only a retry the proxy forwards after proven absence writes.
    retried = caller == "proxy" and state == "safe_to_retry"
    assert upstream.commits(path) == (0 if existing is None else 1) + retried
    if caller == "cli":
        assert code == 0


# Answers a read can give that cannot be judged: each is a failed read, recorded, never `reconciling`;
# it proves nothing, so the receipt stays outcome_unknown (tests/e2e/reconcile/test_failed_reads.py: what follows).
UNJUDGEABLE = [
    pytest.param("deepjson", "the answer is not JSON", id="json-nested-too-deep"),
    pytest.param("badutf8", "the answer is not JSON", id="invalid-utf-8"),
    pytest.param("notjson", "the answer is not JSON", id="not-json"),
    pytest.param("500", "HTTP 500: the read failed, nothing is proven", id="answers-500"),
]


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("fault, reason", UNJUDGEABLE)
def test_an_answer_that_cannot_be_judged_is_a_failed_read(
    caller, clients, proxy, upstream, bucket, capsys, fault, reason
):
    path = f"/api/{bucket}/things"
    r = unknown_write(clients, proxy, upstream, bucket, "things", {"title": fault}, "drop")
    upstream.plan_read(path, fault)
    state, got_reason, _, code, err = reconcile_by(
        caller, clients, proxy, upstream, bucket, "things", {"title": fault}, capsys
    )
    assert state == "outcome_unknown" and reason in got_reason, got_reason
    assert "failed read 1 of 3: next read not before" in got_reason, got_reason
    assert upstream.reads(path) == 1 and upstream.commits(path) == 1
    if caller == "cli":
        assert code == 1
        assert err.startswith("Error: 1 read failed and proved nothing:\n") and r.operation_id in err
    # Not stuck in reconciling: a person can resolve it, and the next read may run.
    assert main(["--db", str(proxy.db), "resolve", r.operation_id, "--as", "succeeded", "--note", "seen it"]) == 0


@pytest.fixture
def tls_proxy(tmp_path, confdir, tls_upstream):
    p = Proxy(tmp_path, confdir, upstream_ca=tls_upstream.cert_path)
    p.start()
    yield p
    p.stop()


def test_cli_reads_verify_tls_like_the_proxy(tls_proxy, tls_upstream, bucket, capsys, monkeypatch):
    """A private-CA upstream: the proxy trusts it by option; the CLI by --cacert or $SSL_CERT_FILE."""
    from tests.e2e.processes import Clients

    clients = Clients(tls_proxy)
    r = unknown_write(clients, tls_proxy, tls_upstream, bucket, "things", {"title": "tls"}, "drop")
    db, rules = str(tls_proxy.db), str(TEST_RULES)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    capsys.readouterr()
    assert main(["--db", db, "reconcile", r.operation_id, "--rules", rules]) == 1
    out, err = capsys.readouterr()
    assert "CERTIFICATE_VERIFY_FAILED" in out and r.operation_id in err and "failed" in err
    # The failed read left it outcome_unknown, waiting for its next read: --now reads it at once.
    assert (
        main(
            [
                "--db",
                db,
                "reconcile",
                r.operation_id,
                "--rules",
                rules,
                "--cacert",
                str(tls_upstream.cert_path),
                "--now",
            ]
        )
        == 0
    )
    assert "found among 1 items" in capsys.readouterr().out
    # $SSL_CERT_FILE works too, as for curl and Python's ssl: a second receipt, read the same way.
    r2 = unknown_write(clients, tls_proxy, tls_upstream, bucket, "things", {"title": "tls2"}, "drop")
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_upstream.cert_path))
    assert main(["--db", db, "reconcile", r2.operation_id, "--rules", rules]) == 0
    assert "found among 2 items" in capsys.readouterr().out
    assert tls_upstream.commits(f"/api/{bucket}/things") == 2  # the two writes, never a third
