"""
The errors receipt-proxy raises. Every one says what went wrong and how to fix it.

    ReceiptsError
    ├── RulesError            a rules file is malformed (names file, line and field)
    ├── ReconcileError        a reconcile read could not be planned or was refused
    │                         (a template without a value, a read that is not a read)
    ├── BodyTooLarge          a request body decodes past the bound (receipts_body_cap)
    ├── UnpairedSurrogate     text entering the intent holds a lone surrogate (JSON "\\ud800")
    ├── BadEncoding           a Content-Encoding stream is corrupt or truncated
    │   └── UnsupportedEncoding  a content coding nobody can decode (compress, a typo)
    ├── BadJson               a matched write's JSON body that servers read in more than one way
    │                         (a key twice in one object): the proxy answers 400, sends nothing
    ├── UncountableWrite      a write a budget sums a field of, with no number there: 400, not sent
    ├── DraftError            an API document or a traffic file that no rules can be drafted from
    └── StoreError            the receipts database could not be read or written
        ├── StoreUnavailable  the write did not happen (locked, read-only, disk full):
        │                     the request must not be forwarded
        ├── IllegalTransition a state change the transition table forbids, or one
        │                     that lost a race (the receipt was no longer in the
        │                     expected state)
        │   └── LinkUsed      an approval link that decided its write already
        └── UnknownReceipt    no receipt has that id
"""

from __future__ import annotations


class ReceiptsError(Exception):
    """Base class of every error receipt-proxy raises on purpose."""


class RulesError(ReceiptsError, ValueError):
    """
    A rules file is malformed.

    `str(error)` reads `rules/dev.to.yaml:12: operations.articles.create.match.path:
    unbalanced '{' in path template '/api/{id'`.
    """

    def __init__(self, message: str, *, source: str, line: int | None = None, field: str | None = None):
        self.message = message
        self.source = source
        self.line = line
        self.field = field
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


class DraftError(ReceiptsError, ValueError):
    """
    `receipts rules draft` cannot read its input: an OpenAPI document, a flow file or a HAR file
    that is not one, or a `$ref` it cannot follow. `str(error)` names the file and, where there
    is one, the place in it (`resend.yaml: #/paths/~1emails/post/requestBody: $ref
    'other.yaml#/X' is not local`).
    """

    def __init__(self, message: str, *, source: str, where: str | None = None):
        self.message = message
        self.source = source
        self.where = where
        super().__init__(f"{source}: {where}: {message}" if where else f"{source}: {message}")


class ReconcileError(ReceiptsError):
    """A reconcile read could not be planned, or was refused because it is not a read."""


class StoreError(ReceiptsError):
    """The receipts database could not be used."""


class StoreUnavailable(StoreError):
    """A write to the receipts database failed; nothing was recorded."""


class IllegalTransition(StoreError):
    """The transition table forbids this state change, or the receipt moved on meanwhile."""


class LinkUsed(IllegalTransition):
    """An approval link that decided its write already: a link decides once (gate/approval_links.py)."""


class UnknownReceipt(StoreError, LookupError):
    """No receipt has this operation id."""


class BodyTooLarge(ReceiptsError):
    """
    A request body is, or decodes to, more than `limit` bytes (bodies.decode_body stops there,
    so a decompression bomb never grows past it). The proxy answers 413 and sends nothing.
    """

    def __init__(self, limit: int, *, encoding: str | None = None):
        self.limit = limit
        self.encoding = encoding
        what = f"decodes ({encoding}) to" if encoding else "is"
        super().__init__(
            f"the request body {what} more than {limit} bytes, the bound set by the option receipts_body_cap; "
            "nothing was sent (raise receipts_body_cap to accept larger bodies)"
        )


class BadEncoding(ReceiptsError, ValueError):
    """A body's Content-Encoding cannot be decoded: a corrupt or truncated stream, or too many codings."""

    def __init__(self, message: str, *, encoding: str | None = None):
        self.encoding = encoding
        super().__init__(message)


class UnsupportedEncoding(BadEncoding):
    """A content coding the proxy cannot decode (it knows gzip, x-gzip, deflate, br, zstd and identity)."""


class BadJson(ReceiptsError):
    """
    A matched write's JSON body that parsers read in more than one way: an object with a key
    twice (Python and Node take the last, others the first). The proxy answers 400 and sends
    nothing. `str(error)` names the key and where it is (`the key 'title' twice in the object
    at items.0 of the JSON body`), never a value.
    """


class UncountableWrite(ReceiptsError):
    """
    A write whose operation sums a field in a budget (`budget: {sum: amount}`) and whose request has
    no number there: it cannot be counted, so the proxy answers 400 and sends nothing (no receipt).
    The message names the field, never its value.
    """


class UnpairedSurrogate(ReceiptsError, ValueError):
    """
    Text that enters a request's intent holds an unpaired UTF-16 surrogate: a JSON `"\\ud800"`
    escape without its pair, which is no Unicode text. Servers read it differently (Python keeps
    it, Go replaces it with U+FFFD), and no fingerprint can be taken on it: the proxy answers 400
    and sends nothing, as it does for any bad input (not 503: the store is fine).
    """

    def __init__(self) -> None:
        super().__init__(
            "the request holds an unpaired surrogate (a JSON \\uD800-\\uDFFF escape without its pair) in text "
            "that enters its fingerprint: it is not Unicode text, and servers read it differently"
        )
