"""
Security: owner-only files, loopback by default, TLS interception only for ruled hosts.
(No credential reaching the DB or the logs: test_secrets.py, and after every run the sweep
in conftest.py, no_marker_secret_anywhere.)
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

import requests

from tests.e2e.processes import Clients, Proxy, ScriptsRun


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_state_dir_db_and_secret_are_owner_only(tmp_path, confdir, upstream, bucket):
    state = tmp_path / "state"  # does not exist yet: the addon creates it
    proxy = Proxy(tmp_path, confdir, db=state / "receipts.db").start()
    try:
        assert (
            Clients(proxy).send("requests", "POST", f"{upstream.url}/api/{bucket}/plain", {"title": "p"}).status == 201
        )
        assert mode(state) == 0o700
        for name in ("receipts.db", "receipts.db-wal", "receipts.db-shm", "secret.key"):
            assert mode(state / name) == 0o600, name
        assert mode(state / "receipts.db.instances") == 0o700
    finally:
        proxy.stop()


def test_an_unruled_https_host_is_tunnelled_without_the_mitmproxy_ca(proxy, tls_upstream, unruled_tls_upstream):
    """The rules name 127.0.0.1 (and so its loopback aliases); 127.0.0.2 is another host, so its TLS goes
    through untouched."""
    url = f"https://127.0.0.2:{unruled_tls_upstream.port}/elsewhere"
    proxies = {"https": proxy.url}
    # Trusting only the upstream's own certificate works, because the proxy did not intercept.
    r = requests.post(url, json={"x": 1}, proxies=proxies, verify=str(unruled_tls_upstream.cert_path), timeout=10)
    assert r.status_code == 201
    assert "x-receipt-id" not in r.headers
    # A ruled host is intercepted: the upstream's certificate alone is not enough there.
    try:
        requests.get(
            f"https://127.0.0.1:{tls_upstream.port}/", proxies=proxies, verify=str(tls_upstream.cert_path), timeout=10
        )
    except requests.exceptions.SSLError:
        pass
    else:
        raise AssertionError("a ruled host was not intercepted")


def test_intercept_all_intercepts_unruled_hosts_too(tmp_path, confdir, unruled_tls_upstream):
    up = unruled_tls_upstream
    proxy = Proxy(tmp_path, confdir, upstream_ca=up.cert_path, extra=("--set", "receipts_intercept_all=true")).start()
    try:
        url = f"https://127.0.0.2:{up.port}/elsewhere"
        try:
            requests.get(url, proxies={"https": proxy.url}, verify=str(up.cert_path), timeout=10)
        except requests.exceptions.SSLError:
            pass
        else:
            raise AssertionError("127.0.0.2 was not intercepted with receipts_intercept_all")
        r = requests.get(url, proxies={"https": proxy.url}, verify=str(proxy.ca), timeout=10)
        assert r.status_code == 200
    finally:
        proxy.stop()


def run_script(args: list[str], tmp_path: Path, confdir: Path) -> str:
    """Start scripts/run, wait until it is ready, stop it by PID, return its output."""
    run = ScriptsRun(tmp_path, confdir, tuple(args), log=tmp_path / f"run-{len(args)}.log")
    try:
        run.start()
    finally:
        run.stop()
    return run.log()


def test_scripts_run_binds_the_proxy_to_loopback(tmp_path, confdir):
    out = run_script(["--headless"], tmp_path, confdir)
    assert re.search(r"HTTP\(S\) proxy listening at 127\.0\.0\.1:\d+\.", out), out
    assert "export HTTPS_PROXY=http://127.0.0.1:" in out


def test_scripts_run_mitmweb_binds_to_loopback_and_keeps_its_token(tmp_path, confdir):
    out = run_script([], tmp_path, confdir)
    assert re.search(r"HTTP\(S\) proxy listening at 127\.0\.0\.1:\d+\.", out), out
    assert re.search(r"Web server listening at http://127\.0\.0\.1:\d+/", out), out
    # The token is scripts/run's (its banner; tests/e2e/run/test_scripts_run.py opens it), mitmweb only gets its hash.
    assert re.search(r"^Web UI: http://127\.0\.0\.1:\d+/\?token=[0-9a-f]{32} ", out, re.M), out
