"""One credential, several spellings, one principal: the auth scheme's case and the whitespace
around and inside a credential header never make a second write."""

from __future__ import annotations

import pytest

from proxy_addon.intent.fingerprint import canonical_credential


@pytest.mark.parametrize("name, value, canonical", [
    ("authorization", "Bearer k1", "bearer k1"),
    ("authorization", "bearer k1", "bearer k1"),
    ("authorization", "BEARER   k1", "bearer k1"),
    ("authorization", " Bearer\tk1 ", "bearer k1"),
    ("authorization", "Bearer K1", "bearer K1"),  # the token keeps its case
    ("authorization", "k1", "k1"),  # no scheme: the value as it is
    ("proxy-authorization", "Basic  dXNlcg==", "basic dXNlcg=="),
    ("api-key", "  Key-1  ", "Key-1"),  # a rule's own header: whitespace only, never case
    ("cookie", "session=AbC;  theme=x", "session=AbC; theme=x"),
])
def test_canonical_credential(name, value, canonical):
    assert canonical_credential(name, value) == canonical


@pytest.mark.parametrize("client", ["requests", "httpx", "curl"])
def test_three_spellings_of_one_credential_make_one_write(clients, upstream, bucket, client):
    url = f"{upstream.url}/api/{bucket}/things"
    spellings = ["Bearer k1-SeCrEt", "bearer k1-SeCrEt", "Bearer  k1-SeCrEt"]
    answers = [clients.send(client, "POST", url, {"title": "one"}, headers={"api-key": "", "Authorization": s})
               for s in spellings]
    assert [a.status for a in answers] == [201, 201, 201]
    assert [a.headers.get("x-receipt-replayed") for a in answers] == [None, "true", "true"]
    assert upstream.commits(f"/api/{bucket}/things") == 1
    other = clients.send(client, "POST", url, {"title": "one"}, headers={"api-key": "", "Authorization": "Bearer k2"})
    assert other.headers.get("x-receipt-replayed") is None  # another account is another principal
    assert upstream.commits(f"/api/{bucket}/things") == 2
