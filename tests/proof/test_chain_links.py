"""An event's canonical form: the fast path (the standard library's JSON) writes exactly what jcs.py writes."""

from __future__ import annotations

import pytest

from proxy_addon.proof.chain_links import canonical_form, record_hash
from proxy_addon.proof.jcs import MAX_INT, canonical

TEXTS = ["", "plain", "é ü 漢字", "\U0001f600", "\x7f\u2028\u2029", '"quoted" \\ back', "".join(map(chr, range(0x20)))]


@pytest.mark.parametrize("text", TEXTS)
def test_the_fast_path_is_jcs(text):
    row = {"reason": text, "id": MAX_INT, "chain_seq": -3, "flow_id": None, "hash": "ignored", "at": text[::-1]}
    expected = canonical({"reason": text, "id": MAX_INT, "chain_seq": -3, "at": text[::-1]})
    assert canonical_form(row) == expected
    assert record_hash(row) == record_hash({**row, "hash": "other"})  # the hash never covers itself


def test_what_the_fast_path_leaves_to_jcs():
    assert canonical_form({"n": MAX_INT + 1 - 1, "b": True}) == b'{"b":true,"n":9007199254740991}'
    with pytest.raises(ValueError, match="JCS"):
        canonical_form({"n": MAX_INT + 1})
    with pytest.raises(ValueError, match="lone surrogate"):
        canonical_form({"reason": "\ud800"})
