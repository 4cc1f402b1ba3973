"""
`receipts rules draft`: a first rules file for an API that has no pack, drafted from its OpenAPI
document (or, with the proxy's help, from the traffic it has seen). A draft is a start: what the
drafter could not decide is a `# TODO:` comment naming where it looked, and `receipts rules check`
lists every one as a warning.

    openapi_document.py  an OpenAPI 3.x or Swagger 2.0 document, local $refs followed
    schema_fields.py     what a schema says of fields: required, identifying, secret, blob, id, list items
    read_names.py        which method names read as reads (RPC-style APIs, a REST POST search)
    openapi_draft.py     the document → a DraftFile (`draft_openapi`)
    draft_model.py       a drafted file: its keys, operations, notes and TODOs
    draft_yaml.py        a DraftFile → the rules file's text (`write_draft`)
"""

from __future__ import annotations

from proxy_addon.draft.draft_model import DraftFile, DraftOperation
from proxy_addon.draft.draft_yaml import write_draft
from proxy_addon.draft.openapi_document import ApiDocument, parse_document, read_document
from proxy_addon.draft.openapi_draft import draft_openapi

__all__ = [
    "ApiDocument",
    "DraftFile",
    "DraftOperation",
    "draft_openapi",
    "parse_document",
    "read_document",
    "write_draft",
]
