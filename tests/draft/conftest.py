"""
The real OpenAPI documents the drafter is tested on: tests/openapi/, copied unchanged from their
publishers with their MIT licenses beside them (tests/openapi/README.md says from where).
`RECEIPTS_OPENAPI_DIR` points the tests at another copy.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPENAPI = Path(os.environ.get("RECEIPTS_OPENAPI_DIR", ROOT / "tests" / "openapi"))


def document(name: str) -> Path:
    path = OPENAPI / name
    assert path.is_file(), f"{path} is not there: the real OpenAPI documents the drafter is tested on"
    return path
