"""
A mitmproxy flow file (what `mitmdump -w` and mitmweb's save write) → request shapes, one JSON
line each on standard output (draft/request_shapes.py), for `receipts rules draft --flows`:

    python -m proxy_addon.mitm.flow_file session.flows > shapes.jsonl

Read with mitmproxy's own reader (mitmproxy.io.FlowReader: every version's format, migrated);
the CLI runs this as a subprocess because only this layer imports mitmproxy. Only the writes
(POST, PUT, PATCH, DELETE) of HTTP flows are written; a field named like a secret has no value,
a token-shaped value is REDACTED, and no header value is written. Exit status 2 and one line on
standard error for a file that is not a flow file.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from mitmproxy import exceptions, http
from mitmproxy.io import FlowReader

from proxy_addon.draft.request_shapes import MUTATING, RequestShape, shape_line, shape_of
from proxy_addon.errors import ReceiptsError
from proxy_addon.mitm.learn_file import MAX_BODY
from proxy_addon.wire.bodies import decode_body


def shapes_in(path: Path) -> Iterator[RequestShape]:
    with path.open("rb") as fo:
        for flow in FlowReader(fo).stream():
            if not isinstance(flow, http.HTTPFlow) or flow.request.method.upper() not in MUTATING:
                continue
            req = flow.request
            try:  # decoded within MAX_BODY, as receipts_learn reads one: a compressed bomb is not opened
                body = decode_body(req.raw_content or b"", req.headers.get("content-encoding"), limit=MAX_BODY)
            except ReceiptsError:
                body = None
            status = flow.response.status_code if flow.response is not None else None
            headers = [(k, v) for k, v in req.headers.items(multi=True)]
            yield shape_of(req.method, req.url, headers, body, status, req.timestamp_start)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m proxy_addon.mitm.flow_file FLOWFILE", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        for shape in shapes_in(path):
            sys.stdout.write(shape_line(shape) + "\n")
    except (OSError, exceptions.FlowReadException) as e:
        print(f"{path}: not a mitmproxy flow file: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
