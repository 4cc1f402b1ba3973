"""
The Prometheus endpoint (`--set receipts_metrics=HOST:PORT`): a real mitmdump in front of a real
upstream, real clients, then a real scrape (httpx) parsed with prometheus_client's own parser.
Every count is asserted exactly, and against the receipts' history in the database; the scrape
carries no credential, receipt id, fingerprint or URL. A bad value or a busy port stops the
proxy with one line naming the option. Without a proxy: tests/gate/test_metrics.py (the observer and the
gauge), tests/mitm/test_metrics_server.py (the server), tests/mitm/test_options_listen.py (the option).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from proxy_addon.mitm.options import parse_listen
from proxy_addon.states import State
from proxy_addon.store import Store
from tests.conftest import ROOT, SECRETS, TEST_RULES, wait_for
from tests.e2e.processes import METRICS_URL, Clients, Proxy, ScriptsRun
from tests.e2e.proxy.test_startup import BAD_RULES, run_until_exit
from tests.e2e.run.test_approval import held_flow, operator
from tests.mitm.conftest import setup  # noqa: F401  (the taddons fixture, for the run-time change)
from tests.mitm.test_metrics_server import by, scrape

API = "test-api"


def start(tmp_path: Path, confdir: Path, *extra: str, rules: Path = TEST_RULES) -> tuple[Proxy, str]:
    """A proxy serving metrics on a port the kernel picks (port 0), and the URL it logged."""
    proxy = Proxy(tmp_path, confdir, rules=rules, extra=("--set", "receipts_metrics=127.0.0.1:0", *extra)).start()
    match = wait_for(lambda: METRICS_URL.search(proxy.log()), timeout=10, what="the metrics URL in the log")
    return proxy, match.group(1)


def value(url: str, name: str, *labels: str) -> float:
    return by(scrape(url)[1], name, "api", "operation").get(tuple(labels), 0.0)


def test_a_scripted_sequence_is_counted_exactly(tmp_path, confdir, upstream, bucket):
    """
    A success, its replay; a drop (outcome_unknown), and its duplicate, which the proxy reconciles
    with a read (found: blocked as succeeded); a drop with no read configured, and its blocked
    duplicate; a duplicate that waits for an original in flight; a write held for approval that
    times out; then `receipts reconcile` from another process. That last one changes only the
    gauge read from the database: the counters count what this proxy process did.
    """
    proxy, url = start(tmp_path, confdir, "--set", "receipts_approval_timeout=2")
    clients = Clients(proxy)
    things, plain = f"/api/{bucket}/things", f"/api/{bucket}/plain"
    waited, refunds = f"/api/{bucket}w/things", f"/api/{bucket}/refunds"
    try:
        send = lambda path, body: clients.send("requests", "POST", f"{upstream.url}{path}", body)  # noqa: E731
        ok = send(things, {"title": "first"})
        assert ok.status == 201
        again = send(things, {"title": "first"})
        assert (again.status, again.headers.get("x-receipt-replayed")) == (201, "true")

        upstream.plan(things, "drop")
        assert send(things, {"title": "dropped"}).status == 502
        found = send(things, {"title": "dropped"})  # reconciled inline: the read finds it
        assert (found.status, found.json()["state"]) == (409, "succeeded")

        upstream.plan(plain, "drop")
        assert send(plain, {"title": "p"}).status == 502
        blocked = send(plain, {"title": "p"})
        assert (blocked.status, blocked.json()["error"]) == (409, "duplicate_unresolved")

        upstream.plan(waited, "held")
        answers: dict[str, object] = {}
        first = threading.Thread(target=lambda: answers.update(first=send(waited, {"title": "w"})))
        first.start()
        wait_for(lambda: upstream.seen(waited) == 1, what="the held write to reach the upstream")
        second = threading.Thread(target=lambda: answers.update(second=send(waited, {"title": "w"})))
        second.start()
        wait_for(
            lambda: value(url, "receipt_proxy_duplicate_waits_total", API, "things.create") == 1,
            what="the duplicate to wait for the original",
        )
        upstream.let_go(waited)
        first.join(timeout=20)
        second.join(timeout=20)
        assert answers["first"].status == 201  # type: ignore[attr-defined]
        assert answers["second"].headers.get("x-receipt-replayed") == "true"  # type: ignore[attr-defined]

        denied: dict[str, object] = {}
        held = threading.Thread(target=lambda: denied.update(answer=send(refunds, {"amount": 5})))
        held.start()
        wait_for(
            lambda: value(url, "receipt_proxy_approvals_pending", API, "refunds.create") == 1,
            what="the write held for approval to show as pending",
        )
        held.join(timeout=20)
        assert denied["answer"].status == 403  # type: ignore[attr-defined]

        text, samples = scrape(url)
        assert by(samples, "receipt_proxy_transitions_total", "operation", "from_state", "to_state") == {
            ("things.create", "new", "submitted"): 3,  # first, dropped, w
            ("things.create", "submitted", "succeeded"): 2,  # first, w
            ("things.create", "submitted", "outcome_unknown"): 1,  # dropped
            ("things.create", "outcome_unknown", "reconciling"): 1,  # its duplicate's read
            ("things.create", "reconciling", "succeeded"): 1,  # found
            ("plain.create", "new", "submitted"): 1,
            ("plain.create", "submitted", "outcome_unknown"): 1,
            ("refunds.create", "new", "awaiting_approval"): 1,
            ("refunds.create", "awaiting_approval", "rejected"): 1,  # timed out
        }
        assert by(samples, "receipt_proxy_duplicates_total", "operation", "answer") == {
            ("things.create", "replayed"): 2,
            ("things.create", "blocked_succeeded"): 1,
            ("plain.create", "blocked"): 1,
        }
        # Every operation of the rules has the duplicates series from the start (at 0).
        assert (
            by(samples, "receipt_proxy_duplicates_total", "operation", "answer", zeros=True)[
                ("payments.create", "key_conflict")
            ]
            == 0
        )
        assert by(samples, "receipt_proxy_duplicate_waits_total", "operation") == {("things.create",): 1}
        assert by(samples, "receipt_proxy_reconcile_reads_total", "operation", "result") == {
            ("things.create", "found"): 1
        }
        assert by(samples, "receipt_proxy_approvals_pending", "operation", zeros=True) == {("refunds.create",): 0}
        assert by(samples, "receipt_proxy_approval_decisions_total", "operation", "decision") == {
            ("refunds.create", "timeout"): 1
        }
        assert by(samples, "receipt_proxy_unknown_outcomes", "operation", "state") == {
            ("plain.create", "outcome_unknown"): 1
        }
        assert by(samples, "receipt_proxy_receipt_commit_seconds_count", "operation") == {
            ("things.create",): 3,
            ("plain.create",): 1,
            ("refunds.create",): 1,
        }
        assert by(samples, "receipt_proxy_upstream_seconds_count", "operation") == {
            ("things.create",): 3,
            ("plain.create",): 1,
        }
        assert all(v > 0 for v in by(samples, "receipt_proxy_upstream_seconds_sum", "operation").values())
        assert by(samples, "receipt_proxy_rules_reloads_total", "result") == {}
        assert by(samples, "receipt_proxy_rules_last_reload_successful") == {(): 1}
        assert samples["process_cpu_seconds_total"][0][1] > 0

        # The counters are the database's own history of what this process did.
        store = Store.open(proxy.db, create=False)
        receipts = store.list(limit=None)
        history: dict[tuple[str, str, str], int] = {}
        for r in receipts:
            for e in store.events(r.operation_id):
                if e.event == "transition":
                    key = (r.operation, str(e.from_state or "new"), str(e.to_state))
                    history[key] = history.get(key, 0) + 1
        assert by(samples, "receipt_proxy_transitions_total", "operation", "from_state", "to_state") == history
        assert (upstream.commits(things), upstream.commits(plain), upstream.commits(waited)) == (2, 1, 1)

        # Nothing in the scrape names a credential, a receipt, a fingerprint or a URL.
        forbidden = [*SECRETS.values(), bucket, upstream.url, f":{upstream.port}", "/api/", "?"]
        forbidden += [x for r in receipts for x in (r.operation_id, r.intent_fingerprint, r.principal, r.target)]
        assert [x for x in forbidden if x in text] == []

        # Another process settles what it can: the gauge, read from the database, follows; the counters do not.
        (unknown,) = [r for r in receipts if r.operation == "plain.create"]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy_addon.cli",
                "--db",
                str(proxy.db),
                "reconcile",
                unknown.operation_id,
                "--rules",
                str(proxy.rules),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)[0]["state"] == "manual_review"  # no read configured: a human decides
        _, later = scrape(url)
        assert by(later, "receipt_proxy_unknown_outcomes", "operation", "state") == {
            ("plain.create", "manual_review"): 1
        }
        for name in (
            "receipt_proxy_transitions_total",
            "receipt_proxy_duplicates_total",
            "receipt_proxy_reconcile_reads_total",
        ):
            assert sorted(map(repr, later[name])) == sorted(map(repr, samples[name]))
    finally:
        proxy.stop()


def test_rules_reloads_are_counted_ok_and_failed(tmp_path, confdir):
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(TEST_RULES / "test-api.yaml", rules / "test-api.yaml")
    proxy, url = start(tmp_path, confdir, rules=rules)
    reloads = lambda: by(scrape(url)[1], "receipt_proxy_rules_reloads_total", "result")  # noqa: E731
    try:
        (rules / "extra.yaml").write_text(
            "api: extra\nhosts: [127.0.0.1]\noperations:\n  extra.create:\n"
            "    match: {method: POST, path: '/extra/{bucket}'}\n"
        )
        wait_for(lambda: reloads() == {("ok",): 1}, timeout=15, what="the reload to be counted")
        _, samples = scrape(url)
        assert by(samples, "receipt_proxy_rules_last_reload_successful") == {(): 1}
        # The new operation's series are there from its first reload, at 0.
        assert by(samples, "receipt_proxy_duplicates_total", "api", "answer", zeros=True)[("extra", "replayed")] == 0
        assert (
            by(samples, "receipt_proxy_unknown_outcomes", "api", "state", zeros=True)[("extra", "outcome_unknown")] == 0
        )

        (rules / "extra.yaml").write_text(BAD_RULES.replace("broken", "extra"))
        wait_for(lambda: reloads() == {("ok",): 1, ("failed",): 1}, timeout=15, what="the failed reload")
        assert by(scrape(url)[1], "receipt_proxy_rules_last_reload_successful", zeros=True) == {(): 0}
        assert "rules NOT reloaded" in proxy.log()
    finally:
        proxy.stop()


def test_scripts_run_serves_metrics_and_counts_an_operators_decisions(tmp_path, confdir, upstream, bucket):
    """
    scripts/run (mitmweb) turns metrics on; a write approved and one denied with mitmweb's Resume
    and Abort, then one denied and one approved with `receipts deny` and `receipts approve`.
    """
    run = ScriptsRun(tmp_path, confdir).start()  # RECEIPT_PROXY_METRICS=127.0.0.1:0 (conftest)
    path = f"/api/{bucket}/refunds"
    answers: dict[int, requests.Response] = {}

    def agent(amount: int) -> None:
        answers[amount] = requests.post(
            upstream.url + path,
            json={"amount": amount},
            timeout=30,
            proxies={"http": run.proxy_url, "https": run.proxy_url},
        )

    try:
        assert "Prometheus metrics: on 127.0.0.1, at a free port" in run.log()
        assert run.metrics_url
        web, base = operator(run.web_url)
        db = tmp_path / "state" / "receipts.db"
        for amount, decide in ((10, "resume"), (20, "kill"), (30, "deny"), (40, "approve")):
            t = threading.Thread(target=agent, args=(amount,))
            t.start()
            flow = held_flow(web, base, bucket)
            assert value(run.metrics_url, "receipt_proxy_approvals_pending", API, "refunds.create") == 1
            if decide in ("resume", "kill"):  # mitmweb's buttons
                assert web.post(f"{base}/flows/{flow['id']}/{decide}", timeout=5).status_code == 200
            else:  # the CLI, another process
                (held,) = Store.open(db, create=False).list(states=[State.AWAITING_APPROVAL])
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "proxy_addon.cli",
                        "--db",
                        str(db),
                        decide,
                        held.operation_id,
                        "--note",
                        "by the book",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    cwd=ROOT,
                )
                assert out.returncode == 0, out.stderr
            t.join(timeout=30)
        assert [answers[a].status_code for a in (10, 20, 30, 40)] == [201, 403, 403, 201]
        _, samples = scrape(run.metrics_url)
        assert by(samples, "receipt_proxy_approval_decisions_total", "operation", "decision") == {
            ("refunds.create", "approved"): 2,
            ("refunds.create", "denied"): 2,
        }
        assert by(samples, "receipt_proxy_approvals_pending", "operation", zeros=True) == {("refunds.create",): 0}
        assert by(samples, "receipt_proxy_upstream_seconds_count", "operation") == {("refunds.create",): 2}
        assert by(samples, "receipt_proxy_transitions_total", "from_state", "to_state") == {
            ("new", "awaiting_approval"): 4,
            ("awaiting_approval", "submitted"): 2,
            ("awaiting_approval", "rejected"): 2,
            ("submitted", "succeeded"): 2,
        }
    finally:
        run.stop()


def test_scripts_run_with_metrics_off(tmp_path, confdir):
    run = ScriptsRun(tmp_path, confdir, ("--headless",), env={"RECEIPT_PROXY_METRICS": ""}).start()
    run.stop()
    assert "Prometheus metrics" not in run.log()


@pytest.mark.parametrize(
    "text, message",
    [
        ("9464", "'9464' is not HOST:PORT"),
        (":9464", "':9464' is not HOST:PORT"),
        ("::1:9464", "'::1:9464' is not HOST:PORT"),
        ("127.0.0.1:http", "the port must be a number from 0 to 65535"),
        ("127.0.0.1:65536", "the port must be a number from 0 to 65535"),
    ],
)
def test_a_bad_value_stops_the_proxy_naming_the_option(tmp_path, confdir, text, message):
    with pytest.raises(ValueError, match=message):
        parse_listen(text)
    if text == "9464":  # once through a real mitmdump: it stops at startup, saying so
        code, out = run_until_exit(Proxy(tmp_path, confdir, extra=("--set", f"receipts_metrics={text}")))
        assert code != 0
        assert f"receipts_metrics: {message}" in out


def test_a_busy_port_stops_the_proxy_naming_the_option(tmp_path, confdir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = run_until_exit(Proxy(tmp_path, confdir, extra=("--set", f"receipts_metrics=127.0.0.1:{port}")))
    assert code != 0
    assert f"receipts_metrics: cannot serve metrics at 127.0.0.1:{port}: Address already in use" in out


@pytest.fixture
def db(backend_db) -> str:
    """A receipts database on each backend (tests/conftest.py)."""
    return backend_db
