"""`receipts rules draft`: a rules file drafted from an OpenAPI document, written to standard output."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from proxy_addon.cli.values import UsageError
from proxy_addon.draft import draft_openapi, read_document, write_draft
from proxy_addon.errors import DraftError
from proxy_addon.rules import check_rules


def draft_args(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "draft",
        help="draft a rules file from an API's OpenAPI document",
        description="Draft a rules file for an API that has no pack, from its OpenAPI 3.x or Swagger 2.0\n"
        "document (JSON or YAML; local $refs only), and write it to standard output. What the\n"
        "drafter could not decide is a `# TODO:` comment naming where in the document it looked;\n"
        "`receipts rules check` lists them as warnings. Read them all before the proxy enforces it.",
        epilog="examples:\n  receipts rules draft --openapi resend.yaml > rules/resend.yaml\n"
        "  receipts rules draft --openapi openapi.json --host api.example.com\n"
        "  receipts rules draft --openapi slack_web_openapi_v2.json --writes '^chat\\.(postMessage|update|delete)$'\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--openapi", metavar="FILE", required=True, help="the API's OpenAPI or Swagger document")
    p.add_argument("--host", metavar="HOST", help="the API's host, in place of the document's servers")
    p.add_argument(
        "--writes",
        metavar="REGEX",
        help="an RPC-style API (methods as paths, like /chat.postMessage): the methods whose names this\n"
        "regular expression finds are writes, every other one a read (default: by the method's name)",
    )
    p.add_argument("--api", metavar="NAME", help="the rules file's `api` (default: from the host)")
    p.set_defaults(uses_store=False)


def draft_run(args: argparse.Namespace) -> int:
    try:
        writes = re.compile(args.writes) if args.writes is not None else None
    except re.error as e:
        raise UsageError(f"--writes {args.writes!r}: not a regular expression: {e}") from None
    host = args.host.strip().lower() if args.host else None
    try:
        draft = draft_openapi(read_document(Path(args.openapi).expanduser()), host=host, writes=writes, api=args.api)
    except DraftError as e:
        raise UsageError(f"--openapi {e}") from None
    text = write_draft(draft)
    problems = check_rules(text, source="<draft>")
    if problems:  # --host or --api the loader refuses, or a drafter's mistake: never print rules that do not load
        for problem in problems:
            print(f"the draft does not load: {problem}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    print(
        f"drafted {len(draft.operations)} operations ({len(draft.post_reads)} post_reads) with "
        f"{draft.todo_count()} TODOs from {args.openapi}: `receipts rules check FILE` lists them",
        file=sys.stderr,
    )
    return 0
