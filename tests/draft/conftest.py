"""The real OpenAPI documents the drafter is tested on (../shared/openapi/ beside the checkout; see its README)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPENAPI = Path(os.environ.get("RECEIPTS_OPENAPI_DIR", ROOT.parent / "shared" / "openapi"))


def document(name: str) -> Path:
    path = OPENAPI / name
    if not path.is_file():
        pytest.skip(f"{path} is not there (set RECEIPTS_OPENAPI_DIR to the folder of the real OpenAPI documents)")
    return path
