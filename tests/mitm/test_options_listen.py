"""
`receipts_metrics=HOST:PORT` as the options parse it (mitm/options.py `parse_listen`): what it accepts,
and the one line that names what is wrong with what it refuses.
"""

from __future__ import annotations

import pytest

from proxy_addon.mitm.options import parse_listen
from tests.mitm.conftest import setup  # noqa: F401  (the taddons fixture, for the run-time change)


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("", None),
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("localhost:0", ("localhost", 0)),
        ("[::1]:9464", ("::1", 9464)),
        (" 0.0.0.0:9464 ", ("0.0.0.0", 9464)),
    ],
)
def test_parse_listen(text, parsed):
    assert parse_listen(text) == parsed
