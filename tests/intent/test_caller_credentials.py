"""
One credential, several spellings, one principal (intent/caller.py `canonical_credential`): the auth
scheme's case and the whitespace around and inside a credential header. Through a real proxy, with each
client: tests/e2e/proxy/test_credentials.py.
"""

from __future__ import annotations

import pytest

from proxy_addon.intent.fingerprint import canonical_credential


@pytest.mark.parametrize(
    "name, value, canonical",
    [
        ("authorization", "Bearer k1", "bearer k1"),
        ("authorization", "bearer k1", "bearer k1"),
        ("authorization", "BEARER   k1", "bearer k1"),
        ("authorization", " Bearer\tk1 ", "bearer k1"),
        ("authorization", "Bearer K1", "bearer K1"),  # the token keeps its case
        ("authorization", "k1", "k1"),  # no scheme: the value as it is
        ("proxy-authorization", "Basic  dXNlcg==", "basic dXNlcg=="),
        ("api-key", "  Key-1  ", "Key-1"),  # a rule's own header: whitespace only, never case
        ("cookie", "session=AbC;  theme=x", "session=AbC; theme=x"),
    ],
)
def test_canonical_credential(name, value, canonical):
    assert canonical_credential(name, value) == canonical
