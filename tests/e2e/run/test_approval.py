"""
The approval gate end to end: scripts/run (mitmweb), a held write, and an operator who
resumes or kills it through mitmweb's own API, the calls its Resume and Abort buttons make.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from proxy_addon.store import Store
from tests.conftest import ROOT, wait_for
from tests.e2e.processes import mitmweb


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
            answers[amount] = requests.post(
                upstream.url + path,
                json={"amount": amount},
                timeout=30,
                proxies={"http": proxy_url, "https": proxy_url},
            )

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
        assert (answers[20].json()["error"], answers[20].json()["reason"]) == (
            "denied_by_operator",
            "denied by operator",
        )
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

    path = f"/api/{bucket}/plain"
    with mitmweb(tmp_path, confdir) as (proxy_url, web_url):
        web, base = operator(web_url)
        upstream.plan(path, "drop")
        first = requests.post(
            upstream.url + path,
            json={"title": "settle me"},
            timeout=30,
            proxies={"http": proxy_url, "https": proxy_url},
        )
        assert first.status_code == 502
        operation_id = first.headers["x-receipt-id"]
        subprocess.run(
            [
                str(Path(sys.executable).parent / "receipts"),
                "--db",
                str(tmp_path / "state" / "receipts.db"),
                "resolve",
                operation_id,
                "--as",
                "succeeded",
                "--note",
                "checked the dashboard",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )

        def flow():
            return next(
                (
                    f
                    for f in web.get(f"{base}/flows", timeout=5).json()
                    if f.get("comment", "").endswith(f"· receipt {operation_id}")
                ),
                None,
            )

        settled = wait_for(
            lambda: (f := flow()) and f["comment"].startswith("succeeded · ") and f,
            timeout=10,
            what="the flow's comment to follow the CLI's resolution",
        )
        assert settled["marked"] == "✅"


@pytest.mark.parametrize("edit", ["put", "upload"])
def test_a_held_write_edited_in_mitmweb_is_denied_and_never_sent(tmp_path, confdir, upstream, bucket, edit):
    """
    An operator edits the held write through mitmweb's own API (PUT /flows/<id>, what its
    request editor calls; or POST /flows/<id>/request/content.data, its body upload), then
    resumes it: the upstream sees no write, the agent gets 403, the receipt is rejected
    "modified while held". Before, the edited body went upstream and the receipt of the
    original intent became succeeded.
    """
    path = f"/api/{bucket}/refunds"
    with mitmweb(tmp_path, confdir) as (proxy_url, web_url):
        web, base = operator(web_url)
        answers: list[requests.Response] = []
        agent = threading.Thread(
            target=lambda: answers.append(
                requests.post(
                    upstream.url + path,
                    json={"amount": 10},
                    timeout=30,
                    proxies={"http": proxy_url, "https": proxy_url},
                )
            )
        )
        agent.start()
        flow = held_flow(web, base, bucket)
        if edit == "put":  # and, once the watch has refreshed it (once a second), it still says it is held
            time.sleep(1.5)
            shown = next(f for f in web.get(f"{base}/flows", timeout=5).json() if f["id"] == flow["id"])
            assert shown["comment"].startswith("AWAITING APPROVAL (resume to send, kill to deny) · test-api ")
            change = {"request": {"content": '{"amount": 1000000}'}}
            assert web.put(f"{base}/flows/{flow['id']}", json=change, timeout=5).status_code == 200
        else:
            upload = {"file": ("body.json", b'{"amount": 1000000}')}
            assert (
                web.post(f"{base}/flows/{flow['id']}/request/content.data", files=upload, timeout=5).status_code == 200
            )
        assert web.post(f"{base}/flows/{flow['id']}/resume", timeout=5).status_code == 200
        agent.join(timeout=30)
        (answer,) = answers
        assert answer.status_code == 403
        assert answer.json()["error"] == "denied_by_operator" and "modified while held" in answer.json()["reason"]
        assert upstream.seen(path) == 0  # neither the edited write nor the recorded one left
        shown = next(f for f in web.get(f"{base}/flows", timeout=5).json() if f["id"] == flow["id"])
        assert "modified while held" in shown["comment"]

    store = Store.open(tmp_path / "state" / "receipts.db", create=False)
    (r,) = [r for r in store.list(limit=None) if bucket in r.target]
    assert (r.intent["body"]["amount"], r.state) == (10, "rejected")
    assert "modified while held" in (r.error or "")
    last = store.events(r.operation_id)[-1]
    assert (last.from_state, last.to_state, last.actor) == ("awaiting_approval", "rejected", "proxy")
    assert "modified while held" in last.reason


def test_a_held_write_whose_agent_hung_up_is_denied_and_a_later_resume_sends_nothing(
    tmp_path, confdir, upstream, bucket
):
    """The agent gives up (its timeout closes the connection) while its write is held: denied at once, said in
    mitmweb."""
    path = f"/api/{bucket}/refunds"
    with mitmweb(tmp_path, confdir) as (proxy_url, web_url):
        web, base = operator(web_url)
        gave_up: list[str] = []

        def agent():
            try:
                requests.post(
                    upstream.url + path,
                    json={"amount": 30},
                    timeout=1.5,
                    proxies={"http": proxy_url, "https": proxy_url},
                )
            except requests.RequestException as e:
                gave_up.append(type(e).__name__)

        thread = threading.Thread(target=agent)
        thread.start()
        flow = held_flow(web, base, bucket)
        thread.join(timeout=10)
        assert gave_up == ["ReadTimeout"]

        def denied():
            shown = next(f for f in web.get(f"{base}/flows", timeout=5).json() if f["id"] == flow["id"])
            return shown if not shown.get("intercepted") and "agent hung up" in shown["comment"] else None

        shown = wait_for(denied, timeout=5, what="the held write to be denied once its agent hung up")
        assert shown["marked"] == "❌"
        web.post(f"{base}/flows/{flow['id']}/resume", timeout=5)  # too late: nothing to send
        web.post(f"{base}/flows/resume", timeout=5)  # Resume all, too
        assert upstream.seen(path) == 0

    store = Store.open(tmp_path / "state" / "receipts.db", create=False)
    (r,) = [r for r in store.list(limit=None) if bucket in r.target]
    assert (r.state, r.error) == ("rejected", "denied: the agent hung up while the write was held")


def test_resume_all_approves_each_held_write(tmp_path, confdir, upstream, bucket):
    """mitmweb's Resume All (POST /flows/resume, the `A` key) approves every held write, each recorded on its own."""
    path = f"/api/{bucket}/refunds"
    with mitmweb(tmp_path, confdir) as (proxy_url, web_url):
        web, base = operator(web_url)
        answers: dict[int, int] = {}

        def agent(amount: int):
            answers[amount] = requests.post(
                upstream.url + path,
                json={"amount": amount},
                timeout=30,
                proxies={"http": proxy_url, "https": proxy_url},
            ).status_code

        agents = [threading.Thread(target=agent, args=(amount,)) for amount in (40, 50)]
        for a in agents:
            a.start()
        wait_for(
            lambda: (
                len(
                    [
                        f
                        for f in web.get(f"{base}/flows", timeout=5).json()
                        if bucket in f["request"]["path"] and f.get("intercepted")
                    ]
                )
                == 2
            ),
            timeout=15,
            what="both writes to be held",
        )
        assert upstream.seen(path) == 0
        assert web.post(f"{base}/flows/resume", timeout=5).status_code == 200
        for a in agents:
            a.join(timeout=30)
        assert answers == {40: 201, 50: 201}
        assert upstream.commits(path) == 2

    store = Store.open(tmp_path / "state" / "receipts.db", create=False)
    rs = [r for r in store.list(limit=None) if bucket in r.target]
    assert sorted((r.intent["body"]["amount"], r.state) for r in rs) == [(40, "succeeded"), (50, "succeeded")]
    for r in rs:
        assert [e.reason for e in store.events(r.operation_id) if e.from_state == "awaiting_approval"] == [
            "approved by operator"
        ]


def readme_script_block() -> list[str]:
    """The shell block of docs/operations.md's "Scripts" bullet (Approvals): what a script runs on mitmweb's API."""
    text = (ROOT / "docs" / "operations.md").read_text()
    after = text[text.index("- **Scripts**: use the CLI") :]
    block = after[after.index("```sh\n") + len("```sh\n") :]
    return [line.strip() for line in block[: block.index("```")].splitlines()]


def test_the_readme_recipe_for_scripts_and_the_cli_both_decide_held_writes(tmp_path, confdir, upstream, bucket):
    """
    docs/operations.md's recipe for mitmweb's HTTP API (Bearer token, the _mitmproxy_xsrf cookie and the
    X-XSRFToken header) run as written with curl, on the real URL, token and flow: it lists
    the held write and resumes it. Without the XSRF pair the same POST gets 403. Then a second
    write is approved with `receipts approve` while mitmweb shows it: the flow leaves the intercept.
    """
    path = f"/api/{bucket}/refunds"
    with mitmweb(tmp_path, confdir) as (proxy_url, web_url):
        web, base = operator(web_url)
        token = parse_qs(urlsplit(web_url).query)["token"][0]
        answers: dict[int, requests.Response] = {}

        def agent(amount: int):
            answers[amount] = requests.post(
                upstream.url + path,
                json={"amount": amount},
                timeout=30,
                proxies={"http": proxy_url, "https": proxy_url},
            )

        first = threading.Thread(target=agent, args=(10,))
        first.start()
        flow = held_flow(web, base, bucket)
        bare = requests.post(
            f"{base}/flows/{flow['id']}/resume", headers={"Authorization": f"Bearer {token}"}, timeout=5
        )
        assert bare.status_code == 403 and upstream.seen(path) == 0  # the XSRF pair is needed

        lines = readme_script_block()
        assert lines[0].startswith("W=http://127.0.0.1:8081 TOKEN=") and lines[3].startswith("FLOW=")
        lines[0], lines[3] = f"W={base} TOKEN={token}", f"FLOW={flow['id']}"
        ran = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", "\n".join(lines)],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "NO_PROXY": "*", "no_proxy": "*"},
        )
        assert ran.returncode == 0, ran.stderr
        listed = ran.stdout.splitlines()[0]
        assert listed.startswith(f"{flow['id']}  AWAITING APPROVAL (resume to send, kill to deny) · ")
        first.join(timeout=30)
        assert answers[10].status_code == 201 and upstream.commits(path) == 1

        second = threading.Thread(target=agent, args=(20,))
        second.start()
        flow = held_flow(web, base, bucket)
        operation_id = flow["comment"].split("receipt ")[1].split(" ")[0]
        approved = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy_addon.cli",
                "--db",
                str(tmp_path / "state" / "receipts.db"),
                "approve",
                operation_id,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert approved.returncode == 0, approved.stderr
        second.join(timeout=30)
        assert answers[20].status_code == 201 and upstream.commits(path) == 2

        def shown():
            f = next(f for f in web.get(f"{base}/flows", timeout=5).json() if f["id"] == flow["id"])
            return f if f["comment"].startswith("succeeded (201) · ") else None

        f = wait_for(shown, timeout=10, what="mitmweb to show the approved write's outcome")
        assert not f["intercepted"] and f["marked"] == "✅"
