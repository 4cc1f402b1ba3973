"""
One credential, several spellings, one principal, through a real proxy with each client: the auth scheme's
case and the whitespace around and inside a credential header never make a second write
(the canonical form itself: tests/intent/test_caller_credentials.py).
"""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("client", ["requests", "httpx", "curl"])
def test_three_spellings_of_one_credential_make_one_write(clients, upstream, bucket, client):
    url = f"{upstream.url}/api/{bucket}/things"
    spellings = ["Bearer k1-SeCrEt", "bearer k1-SeCrEt", "Bearer  k1-SeCrEt"]
    answers = [
        clients.send(client, "POST", url, {"title": "one"}, headers={"api-key": "", "Authorization": s})
        for s in spellings
    ]
    assert [a.status for a in answers] == [201, 201, 201]
    assert [a.headers.get("x-receipt-replayed") for a in answers] == [None, "true", "true"]
    assert upstream.commits(f"/api/{bucket}/things") == 1
    other = clients.send(client, "POST", url, {"title": "one"}, headers={"api-key": "", "Authorization": "Bearer k2"})
    assert other.headers.get("x-receipt-replayed") is None  # another account is another principal
    assert upstream.commits(f"/api/{bucket}/things") == 2
