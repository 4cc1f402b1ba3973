"""
Which header fields the proxy reads as text (wire/fields.py): only those must be UTF-8. Undecodable text
through a real mitmdump: tests/e2e/proxy/test_undecodable_text.py.
"""

from __future__ import annotations


def test_only_the_headers_the_proxy_reads_as_text_must_be_utf8():
    from proxy_addon.wire.fields import undecodable

    fields = [(b"X-Other", b"caf\xe9"), (b"X-Title", b"caf\xc3\xa9"), (b"Api-Key", b"k\xed\xa0\x80")]
    assert undecodable(fields, ("x-title",)) is None
    assert undecodable(fields, ("x-title", "api-key")) == "Api-Key"
    assert undecodable(fields, ("x-other",)) == "X-Other"
