"""
The commonest source of duplicates: an SDK that gives up waiting, then retries the same POST.
A real openai client, through the proxy set in the environment, against the test upstream.
"""

from __future__ import annotations

import openai

from proxy_addon.store import Store


def test_openai_timeout_retry_gets_the_original_success(proxy, upstream, bucket, monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, proxy.url)
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.setenv("no_proxy", "")
    path = f"/api/{bucket}/v1/chat/completions"
    upstream.plan(path, "late")  # commits at once, answers after 2.5 s: past the client's 1 s timeout
    client = openai.OpenAI(
        base_url=f"{upstream.url}/api/{bucket}/v1", api_key="sk-test-not-a-secret", max_retries=2, timeout=1.0
    )
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-test", messages=[{"role": "user", "content": "write once"}]
    )

    assert raw.http_response.status_code == 201
    assert raw.headers.get("x-receipt-replayed") == "true"  # a retry got the original's answer
    assert raw.http_response.json()["id"] == 1
    assert upstream.seen(path) == 1
    assert upstream.commits(path) == 1
    store = Store.open(proxy.db, create=False)
    (r,) = [r for r in store.list(limit=None) if path in r.target]
    assert (r.state, r.external_id) == ("succeeded", "1")
    assert [e.event for e in store.events(r.operation_id)].count("replayed") >= 1
