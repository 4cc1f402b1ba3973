"""
`--set receipts_learn=PATH`: the shape of every write the proxy sees, matched by a rule or not,
appended to PATH as one JSON line (draft/request_shapes.py) when its answer (or its failure)
comes, for `receipts rules draft --flows PATH`.

A line holds the method, the host, the path with its id-like segments as `{id}` (and any
token-shaped one REDACTED), the query's names, the content type, the status (null: no answer, or
the proxy answered itself: a duplicate blocked or replayed, a refusal), when it was sent, the
names of its credential headers, and its body fields by name, each with a keyed HMAC of its
value. The key is made when the proxy starts and lives in its memory only: two equal values have
equal hashes within one run, and no value can be recovered from the file. A field named like a
secret has no hash at all; no header value is written.

Each line is written as it comes (nothing held in memory). A file that cannot be opened stops the
proxy at startup, naming it; a write that fails later (a full disk) is logged (once a minute) and
the flow goes on untouched: learning never breaks the traffic it watches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
from pathlib import Path
from typing import IO

from mitmproxy import ctx, exceptions, http

from proxy_addon.draft.path_clusters import id_like
from proxy_addon.draft.request_shapes import MUTATING, hmac_token, shape_line, shape_of
from proxy_addon.errors import ReceiptsError
from proxy_addon.mitm.flows import META
from proxy_addon.mitm.log_limit import LogLimit
from proxy_addon.wire.bodies import decode_body
from proxy_addon.wire.redaction import redact_path

logger = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024  # bytes of body read for its field names; a larger body's fields are not recorded
ID_SEGMENT = "{id}"
_SEGMENT = re.compile(r"[^/]+")


def learned_path(path: str) -> str:
    """The path as a learn line holds it: id-like segments `{id}`, token-shaped ones REDACTED."""
    return redact_path(_SEGMENT.sub(lambda m: ID_SEGMENT if id_like(m.group(0)) else m.group(0), path))


class LearnFile:
    """The receipts_learn addon: one line a write, appended to the file the option names."""

    def __init__(self) -> None:
        self._key = os.urandom(32)  # never written: hashes compare within this run only
        self._token = hmac_token(self._key)
        self._path = ""
        self._file: IO[str] | None = None
        self._failures = LogLimit(window=60.0)

    def configure(self, updated: set[str]) -> None:
        if "receipts_learn" not in updated:
            return
        self.done()
        self._path = ctx.options.receipts_learn
        if not self._path:
            return
        try:  # a path that cannot be written stops the proxy at startup (or refuses the change), naming it
            self._open()
        except OSError as e:
            self._path = ""
            raise exceptions.OptionsError(f"receipts_learn: cannot write {ctx.options.receipts_learn}: {e}") from None
        logger.info(f"receipt-proxy: writing the shapes of writes to {self._path} (receipts_learn)")

    def _open(self) -> IO[str]:
        if self._file is None:
            fd = os.open(Path(self._path).expanduser(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._file = os.fdopen(fd, "a", encoding="utf-8")
        return self._file

    def done(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def response(self, flow: http.HTTPFlow) -> None:
        self._learn(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._learn(flow)

    def _learn(self, flow: http.HTTPFlow) -> None:
        if not self._path or flow.request.method.upper() not in MUTATING:
            return
        try:
            line = self._line(flow)
            f = self._open()  # opened again after a failed write
            f.write(line + "\n")
            f.flush()
        except Exception as e:  # never break the flow: say so, and go on
            self.done()
            self._failures.log(
                logger, logging.ERROR, "write", f"receipt-proxy: receipts_learn: cannot write {self._path}: {e}"
            )

    def _line(self, flow: http.HTTPFlow) -> str:
        req = flow.request
        meta = flow.metadata.get(META) or {}
        answered_here = meta.get("answer") not in (None, "forward")  # blocked, replayed or refused by the proxy
        status = flow.response.status_code if flow.response is not None and not answered_here else None
        raw = req.raw_content
        body = None
        if raw is not None and len(raw) <= MAX_BODY:
            try:  # decoded within MAX_BODY: a compressed bomb is not opened
                body = decode_body(raw, req.headers.get("content-encoding"), limit=MAX_BODY)
            except ReceiptsError:
                body = None
        headers = list(req.headers.items(multi=True))
        shape = shape_of(req.method, req.url, headers, body, status, req.timestamp_start, self._token)
        return shape_line(dataclasses.replace(shape, path=learned_path(shape.path)))
