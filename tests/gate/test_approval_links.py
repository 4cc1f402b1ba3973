"""Approval links: signed, bound to one receipt, action, fingerprint and rules' version, expiring."""

from __future__ import annotations

import dataclasses

import pytest

from proxy_addon.gate.approval_links import BadLink, Link, link_id, link_key, link_url, sign, verify

KEY = link_key(b"k" * 32)
LINK = Link("20261129T190502Z-7c1e02d9aa", "approve", "sha256:" + "ab" * 32, "p1:0d1f6a2b9e3c4d5f", 2_000_000_000)
NOW = 1_900_000_000.0


def test_a_link_verifies_to_what_it_was_signed_for():
    token = sign(LINK, KEY)
    assert verify(token, KEY, now=NOW) == LINK
    assert verify(sign(dataclasses.replace(LINK, action="deny"), KEY), KEY, now=NOW).approve is False
    assert link_url("http://127.0.0.1:9465/", token) == f"http://127.0.0.1:9465/approvals/{token}"


def test_the_link_key_is_derived_and_another_installation_key_makes_links_that_do_not_verify():
    assert KEY != b"k" * 32 and len(KEY) == 32
    with pytest.raises(BadLink) as e:
        verify(sign(LINK, link_key(b"j" * 32)), KEY, now=NOW)
    assert e.value.kind == "invalid"


@pytest.mark.parametrize(
    "change",
    [
        {"operation_id": "20261129T190502Z-000000000"},
        {"action": "deny"},
        {"fingerprint": "sha256:" + "cd" * 32},
        {"rules_version": "p1:ffffffffffffffff"},
        {"expires": 2_100_000_000},
    ],
)
def test_a_link_whose_fields_were_changed_does_not_verify(change):
    """Each bound field: another value under the original signature is refused (the approve link is not a deny one)."""
    token = sign(LINK, KEY)
    other = sign(dataclasses.replace(LINK, **change), KEY)
    forged = other.split(".")[0] + "." + token.split(".")[1]
    with pytest.raises(BadLink) as e:
        verify(forged, KEY, now=NOW)
    assert e.value.kind == "invalid"


def test_a_link_expires_with_its_approval():
    token = sign(LINK, KEY)
    assert verify(token, KEY, now=LINK.expires - 1) == LINK
    for late in (LINK.expires, LINK.expires + 3600):
        with pytest.raises(BadLink) as e:
            verify(token, KEY, now=late)
        assert e.value.kind == "expired" and "expired" in str(e.value)


@pytest.mark.parametrize("token", ["", "abc", "a.b", "x" * 5000, "eyJ9." + "0" * 64, "!!!." + "0" * 64])
def test_what_is_not_a_link_is_refused(token):
    with pytest.raises(BadLink) as e:
        verify(token, KEY, now=NOW)
    assert e.value.kind == "invalid"


def test_a_payload_signed_by_us_but_not_a_link_is_refused():
    import base64
    import hashlib
    import hmac

    payload = base64.urlsafe_b64encode(b'{"r":1,"a":"approve","f":"x","v":"y","e":"soon"}').rstrip(b"=").decode()
    token = f"{payload}.{hmac.new(KEY, payload.encode(), hashlib.sha256).hexdigest()}"
    with pytest.raises(BadLink, match="not those of an approval link"):
        verify(token, KEY, now=NOW)


def test_each_link_has_its_own_id():
    approve, deny = sign(LINK, KEY), sign(dataclasses.replace(LINK, action="deny"), KEY)
    assert link_id(approve) != link_id(deny) and len(link_id(approve)) == 32
    assert link_id(approve) == link_id(sign(LINK, KEY))  # the same link, the same id
