"""How the commands print: receipts and events as JSON, aligned tables, short names and times."""

from __future__ import annotations

import dataclasses
import itertools
import json
import textwrap
from collections.abc import Iterable
from typing import Any

from proxy_addon.store import Event, Receipt

WIDTH_ROWS = 500  # print_table: the rows that set the columns' widths before any is printed


def receipt_json(r: Receipt) -> dict[str, Any]:
    """
    Every field of a receipt, JSON-ready. Of the recorded answer only what is kept in clear:
    its status, size and whether it is encrypted (store/sealing.py); never its headers or body,
    which may hold a secret the write minted (the CLI has no key to open them, and needs none).
    """
    d = {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "response"}
    d["state"] = str(r.state)
    d["response_status"] = r.response.status if r.response else None
    d["response_size"] = r.response.size if r.response else None
    d["response_encrypted"] = r.response.encryption is not None if r.response else None
    return d


def event_json(e: Event) -> dict[str, Any]:
    d = dataclasses.asdict(e)
    d["from_state"] = str(e.from_state) if e.from_state else None
    d["to_state"] = str(e.to_state)
    return d


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def print_json_array(items: Iterable[Any]) -> None:
    """`print_json` of a list, the same text, each item printed as it comes: the list is never held."""
    first = True
    for item in items:
        print("[" if first else ",")
        print(textwrap.indent(json.dumps(item, indent=2), "  "), end="")
        first = False
    print("[]" if first else "\n]")


def print_table(headers: list[str], rows: Iterable[list[Any]]) -> int:
    """
    Aligned columns, `-` for an empty cell; the last column is not padded. Rows are printed as
    they come: the widths are those of the first WIDTH_ROWS rows (a longer cell after them
    pushes its row's next columns right). Prints nothing for no rows; returns how many it printed.
    """
    rows = iter(rows)
    first = [_cells(row) for row in itertools.islice(rows, WIDTH_ROWS)]
    if not first:
        return 0
    widths = [max(len(r[i]) for r in [headers, *first]) for i in range(len(headers) - 1)]
    n = 0
    for row in itertools.chain([headers], first, (_cells(row) for row in rows)):
        print("  ".join([c.ljust(w) for c, w in zip(row, widths, strict=False)] + [row[-1]]).rstrip())
        n += 1
    return n - 1


def _cells(row: list[Any]) -> list[str]:
    return [("-" if v is None or v == "" else str(v)) for v in row]


def operation_name(r: Receipt) -> str:
    """`dev.to/articles.create`: what `receipts list --operation` takes."""
    return f"{r.api}/{r.operation}"


def short_time(t: str) -> str:
    """`2026-11-29T18:57:11.913481Z` → `2026-11-29T18:57:11Z`."""
    return t.split(".")[0] + "Z" if "." in t else t
