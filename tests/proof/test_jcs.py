"""RFC 8785 canonical JSON for what events hold: the RFC's own examples, and refusals instead of guesses."""

from __future__ import annotations

import json

import pytest

from proxy_addon.proof.jcs import MAX_INT, canonical


def test_rfc8785_string_escapes_and_sorting():
    # RFC 8785 §3.2.2.2: control characters and the two that must be escaped, the rest as itself.
    assert canonical('\u20ac$\u000f\nA\'B"\\\\"/') == b'"\xe2\x82\xac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"'
    assert canonical("\b\t\n\f\r\x00\x1f\x7f\u2028") == '"\\b\\t\\n\\f\\r\\u0000\\u001f\x7f\u2028"'.encode()
    # RFC 8785 §3.2.3: sorting by UTF-16 code units (U+1F600 is a surrogate pair, before U+FB33).
    members = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    out = canonical(members).decode()
    order = [k for k in json.loads(out)]
    assert order == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    # Code point order would put U+FB33 before U+1F600: UTF-16 does not.
    assert sorted(members) != order


def test_values_events_hold():
    assert canonical({"b": 1, "a": None, "c": [True, False], "d": -7}) == b'{"a":null,"b":1,"c":[true,false],"d":-7}'
    assert canonical(MAX_INT) == b"9007199254740991"
    assert json.loads(canonical({"x": "é\u0001"})) == {"x": "é\u0001"}


@pytest.mark.parametrize("value", [MAX_INT + 1, -MAX_INT - 1, 1.5, b"x", {1: "x"}, "\ud800", {"\udc00": 1}])
def test_refused_rather_than_guessed(value):
    with pytest.raises(ValueError, match="JCS"):
        canonical(value)
