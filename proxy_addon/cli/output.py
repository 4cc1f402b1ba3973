"""How the commands print: receipts and events as JSON, aligned tables, short names and times."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from proxy_addon.store import Event, Receipt


def receipt_json(r: Receipt) -> dict[str, Any]:
    """Every field of a receipt, JSON-ready: the recorded response as its status only (a body is bytes)."""
    d = {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "response"}
    d["state"] = str(r.state)
    d["response_status"] = r.response.status if r.response else None
    return d


def event_json(e: Event) -> dict[str, Any]:
    d = dataclasses.asdict(e)
    d["from_state"] = str(e.from_state) if e.from_state else None
    d["to_state"] = str(e.to_state)
    return d


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    """Aligned columns, `-` for an empty cell; the last column is not padded."""
    cells = [[("-" if v is None or v == "" else str(v)) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in [headers, *cells]) for i in range(len(headers) - 1)]
    for row in [headers, *cells]:
        print("  ".join([c.ljust(w) for c, w in zip(row, widths, strict=False)] + [row[-1]]).rstrip())


def operation_name(r: Receipt) -> str:
    """`dev.to/articles.create`: what `receipts list --operation` takes."""
    return f"{r.api}/{r.operation}"


def short_time(t: str) -> str:
    """`2026-11-29T18:57:11.913481Z` → `2026-11-29T18:57:11Z`."""
    return t.split(".")[0] + "Z" if "." in t else t
