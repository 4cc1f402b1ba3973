"""
The approval gate end to end: scripts/run (mitmweb), a held write, and an operator who
resumes or kills it through mitmweb's own API, the calls its Resume and Abort buttons make.
"""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

import requests

from proxy_addon.store import Store
from tests.conftest import mitmweb, wait_for


def held_flow(web: requests.Session, base: str, bucket: str) -> dict:
    def find():
        flows = web.get(f"{base}/flows", timeout=5).json()
        return next((f for f in flows if bucket in f["request"]["path"] and f.get("intercepted")), None)
    return wait_for(find, timeout=15, what="a write to be held in mitmweb")


def operator(web_url: str) -> tuple[requests.Session, str]:
    u = urlsplit(web_url)
    base = f"{u.scheme}://{u.netloc}"
    web = requests.Session()
    web.trust_env = False
    assert web.get(web_url, timeout=5).status_code == 200  # the token URL logs the browser in
    # mitmweb checks a double-submitted XSRF token: the same value in its cookie and a header.
    web.cookies.set("_mitmproxy_xsrf", "receipts-test-xsrf", domain=u.hostname, path="/")
    web.headers["X-XSRFToken"] = "receipts-test-xsrf"
    return web, base


def test_an_operator_approves_one_held_write_and_denies_another(tmp_path, confdir, upstream, bucket):
    path = f"/api/{bucket}/refunds"
    with mitmweb(tmp_path, confdir) as (proxy_url, web_url):
        web, base = operator(web_url)
        answers: dict[int, requests.Response] = {}

        def agent(amount: int):
            answers[amount] = requests.post(upstream.url + path, json={"amount": amount}, timeout=30,
                                            proxies={"http": proxy_url, "https": proxy_url})

        approve = threading.Thread(target=agent, args=(10,))
        approve.start()
        flow = held_flow(web, base, bucket)
        assert flow["comment"].startswith("AWAITING APPROVAL")
        assert upstream.seen(path) == 0  # held: nothing sent yet
        assert web.post(f"{base}/flows/{flow['id']}/resume", timeout=5).status_code == 200
        approve.join(timeout=30)
        assert answers[10].status_code == 201
        assert upstream.commits(path) == 1

        deny = threading.Thread(target=agent, args=(20,))
        deny.start()
        flow = held_flow(web, base, bucket)
        assert web.post(f"{base}/flows/{flow['id']}/kill", timeout=5).status_code == 200
        deny.join(timeout=30)
        assert answers[20].status_code == 403
        assert (answers[20].json()["error"], answers[20].json()["reason"]) == ("denied_by_operator", "denied by operator")
        assert upstream.seen(path) == 1  # the denied one never left

    store = Store.open(tmp_path / "state" / "receipts.db", create=False)
    rs = sorted((r for r in store.list(limit=None) if bucket in r.target), key=lambda r: r.submitted_at)
    assert [(r.intent["body"]["amount"], r.state) for r in rs] == [(10, "succeeded"), (20, "rejected")]
    reasons = [[e.reason for e in store.events(r.operation_id)] for r in rs]
    assert "approved by operator" in reasons[0] and "denied by operator" in reasons[1]


def test_a_resolution_from_the_cli_shows_in_mitmweb(tmp_path, confdir, upstream, bucket):
    """Another process (the receipts CLI) settles a receipt; the flow in mitmweb follows within seconds."""
    import subprocess
    import sys
    from pathlib import Path

    path = f"/api/{bucket}/plain"
    with mitmweb(tmp_path, confdir) as (proxy_url, web_url):
        web, base = operator(web_url)
        upstream.plan(path, "drop")
        first = requests.post(upstream.url + path, json={"title": "settle me"}, timeout=30,
                              proxies={"http": proxy_url, "https": proxy_url})
        assert first.status_code == 502
        operation_id = first.headers["x-receipt-id"]
        subprocess.run([str(Path(sys.executable).parent / "receipts"), "--db", str(tmp_path / "state" / "receipts.db"),
                        "resolve", operation_id, "--as", "succeeded", "--note", "checked the dashboard"],
                       check=True, capture_output=True, timeout=30)

        def flow():
            return next((f for f in web.get(f"{base}/flows", timeout=5).json()
                         if f.get("comment", "").startswith(f"receipt {operation_id}")), None)

        settled = wait_for(lambda: (f := flow()) and f["comment"].endswith("· succeeded") and f,
                           timeout=10, what="the flow's comment to follow the CLI's resolution")
        assert settled["marked"] == "✅"
