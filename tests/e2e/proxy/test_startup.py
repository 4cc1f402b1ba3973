"""
The real mitmdump process: bad configuration stops it with one clear message; rules reload while running.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from proxy_addon.store import Store
from tests.conftest import wait_for
from tests.e2e.processes import Clients, Proxy
from tests.upstream import free_port

BAD_RULES = """\
api: broken
hosts: [127.0.0.1]
operations:
  things.create:
    match: {method: POST, path: "/api/{bucket/things"}
"""


def run_until_exit(proxy: Proxy) -> tuple[int, str]:
    """Start mitmdump with the proxy's arguments (port 0: the kernel picks one); it must exit by itself."""
    p = subprocess.run(proxy.args(), capture_output=True, text=True, timeout=30, cwd=proxy.workdir)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--set", "receipts_lock_timeout=abc"), "bad value for receipts_lock_timeout"),
        (("--set", "receipts_watch_rules=maybe"), "bad value for receipts_watch_rules"),
        (("--set", "receipts_replay_windw=60"), "unknown option receipts_replay_windw"),
        (("--set", "receipts_upstream_timeout=0"), "receipts_upstream_timeout must be a positive number"),
    ],
    ids=["int-not-a-number", "bool-not-a-bool", "misspelt-option", "zero-timeout"],
)
def test_bad_option_value_stops_the_proxy(tmp_path, confdir, extra, message):
    code, out = run_until_exit(Proxy(tmp_path, confdir, extra=extra))
    assert code != 0
    assert message in out


def test_bad_rules_file_stops_the_proxy_naming_file_line_and_field(tmp_path, confdir):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "broken.yaml").write_text(BAD_RULES)
    code, out = run_until_exit(Proxy(tmp_path, confdir, rules=rules))
    assert code != 0
    assert f"{rules / 'broken.yaml'}:5: operations.things.create.match.path: unbalanced" in out


def test_missing_rules_folder_stops_the_proxy(tmp_path, confdir):
    code, out = run_until_exit(Proxy(tmp_path, confdir, rules=tmp_path / "nope"))
    assert code != 0
    assert "no such rules file or folder" in out


def test_eager_connection_strategy_is_overridden(tmp_path, confdir, bucket):
    """With eager connections a refused HTTPS upstream would fail at CONNECT, before any receipt."""
    proxy = Proxy(tmp_path, confdir, extra=("--set", "connection_strategy=eager")).start()
    try:
        answer = Clients(proxy).send(
            "requests", "POST", f"https://127.0.0.1:{free_port()}/api/{bucket}/things", {"title": "eager"}
        )
        assert answer.status == 502
        store = Store.open(proxy.db, create=False)
        (r,) = [r for r in store.list() if bucket in r.target]
        assert r.state == "not_sent"
    finally:
        proxy.stop()


def test_rules_reload_and_a_bad_edit_keeps_the_last_good_rules(tmp_path, confdir, upstream, bucket):
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(Proxy(tmp_path, confdir).rules / "test-api.yaml", rules / "test-api.yaml")
    proxy = Proxy(tmp_path, confdir, rules=rules).start()
    clients = Clients(proxy)
    try:
        url = f"{upstream.url}/extra/{bucket}"
        assert clients.send("requests", "POST", url, {"title": "x"}).headers.get("x-receipt-id") is None
        (rules / "extra.yaml").write_text(
            "api: extra\nhosts: [127.0.0.1]\noperations:\n  extra.create:\n"
            "    match: {method: POST, path: '/extra/{bucket}'}\n"
        )
        wait_for(lambda: "rules reloaded" in proxy.log(), timeout=10, what="the rules reload")
        matched = clients.send("requests", "POST", url, {"title": "y"})
        assert matched.headers.get("x-receipt-state") == "succeeded"

        (rules / "extra.yaml").write_text(BAD_RULES.replace("broken", "extra"))
        wait_for(lambda: "rules NOT reloaded" in proxy.log(), timeout=10, what="the rejected reload")
        assert f"{rules / 'extra.yaml'}:5: operations.things.create.match.path" in proxy.log()
        # The last good rules still apply: the same write is a duplicate of the succeeded one.
        again = clients.send("requests", "POST", url, {"title": "y"})
        assert again.headers.get("x-receipt-replayed") == "true"
        assert upstream.commits(f"/extra/{bucket}") == 2
    finally:
        proxy.stop()
