"""
`receipts rules draft`: a rules file drafted from an OpenAPI document (`--openapi`) or from traffic
(`--flows`: a HAR file, a receipts_learn file, or a mitmproxy flow file, read by a subprocess,
`python -m proxy_addon.mitm.flow_file`, since only the mitm layer imports mitmproxy), written to
standard output.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from proxy_addon.cli.values import UsageError
from proxy_addon.draft import draft_openapi, read_document, write_draft
from proxy_addon.draft.draft_model import DraftFile
from proxy_addon.draft.flows_draft import draft_flows
from proxy_addon.draft.request_shapes import RequestShape, is_har, is_shape_line, read_har, read_shape_lines
from proxy_addon.errors import DraftError
from proxy_addon.rules import check_rules


def draft_args(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "draft",
        help="draft a rules file from an API's OpenAPI document, or from traffic",
        description="Draft a rules file for an API that has no pack, from its OpenAPI 3.x or Swagger 2.0\n"
        "document (JSON or YAML; local $refs only), or from the writes in a mitmproxy flow file\n"
        "(mitmdump -w), a HAR file or a receipts_learn file, and write it to standard output. What the\n"
        "drafter could not decide is a `# TODO:` comment naming where in the document it looked;\n"
        "`receipts rules check` lists them as warnings. Read them all before the proxy enforces it.",
        epilog="examples:\n  receipts rules draft --openapi resend.yaml > rules/resend.yaml\n"
        "  receipts rules draft --openapi openapi.json --host api.example.com\n"
        "  receipts rules draft --openapi slack_web_openapi_v2.json --writes '^chat\\.(postMessage|update|delete)$'\n"
        "  receipts rules draft --flows session.flows --host api.example.com\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--openapi", metavar="FILE", help="the API's OpenAPI or Swagger document")
    source.add_argument(
        "--flows",
        metavar="FILE",
        help="traffic: a mitmproxy flow file (mitmdump -w, mitmweb's save), a HAR file, or a file the proxy\n"
        "wrote with --set receipts_learn=FILE",
    )
    p.add_argument(
        "--host",
        metavar="HOST",
        help="the API's host, in place of the document's servers; with --flows, which host's writes to draft",
    )
    p.add_argument(
        "--writes",
        metavar="REGEX",
        help="an RPC-style API (methods as paths, like /chat.postMessage): the methods whose names this\n"
        "regular expression finds are writes, every other one a read (default: by the method's name)",
    )
    p.add_argument("--api", metavar="NAME", help="the rules file's `api` (default: from the host)")
    p.set_defaults(uses_store=False)


def draft_run(args: argparse.Namespace) -> int:
    host = args.host.strip().lower() if args.host else None
    if args.flows is not None:
        if args.writes is not None:
            raise UsageError("--writes is for --openapi: with --flows, the writes are the POST, PUT, PATCH and DELETE")
        try:
            draft = draft_flows(read_traffic(Path(args.flows).expanduser()), source=args.flows, host=host, api=args.api)
        except DraftError as e:
            raise UsageError(f"--flows {e}") from None
        return _print(draft, args.flows)
    try:
        writes = re.compile(args.writes) if args.writes is not None else None
    except re.error as e:
        raise UsageError(f"--writes {args.writes!r}: not a regular expression: {e}") from None
    try:
        draft = draft_openapi(read_document(Path(args.openapi).expanduser()), host=host, writes=writes, api=args.api)
    except DraftError as e:
        raise UsageError(f"--openapi {e}") from None
    return _print(draft, args.openapi)


def _print(draft: DraftFile, source: str) -> int:
    text = write_draft(draft)
    problems = check_rules(text, source="<draft>")
    if problems:  # --host or --api the loader refuses, or a drafter's mistake: never print rules that do not load
        for problem in problems:
            print(f"the draft does not load: {problem}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    print(
        f"drafted {len(draft.operations)} operations ({len(draft.post_reads)} post_reads) with "
        f"{draft.todo_count()} TODOs from {source}: `receipts rules check FILE` lists them",
        file=sys.stderr,
    )
    return 0


def read_traffic(path: Path) -> list[RequestShape]:
    """The request shapes in a HAR file, a file of shape lines (receipts_learn), or a mitmproxy flow file."""
    try:
        with path.open("rb") as f:
            head = f.read(65536)
    except OSError as e:
        raise DraftError(f"cannot read it: {e.strerror or e}", source=str(path)) from None
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    if is_har(text):
        return read_har(path)
    if is_shape_line(text.split("\n", 1)[0]):
        with path.open(encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        # A proxy still writing (receipts_learn) may be in the middle of its last line: that one waits for next time.
        return list(read_shape_lines(lines[:-1], str(path)))
    # A mitmproxy flow file: mitmproxy's own reader, in the layer that may import mitmproxy.
    done = subprocess.run(
        [sys.executable, "-m", "proxy_addon.mitm.flow_file", str(path)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        check=False,
    )
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1:] or [f"the reader exited with {done.returncode}"]
        raise DraftError(f"not a HAR, receipts_learn or mitmproxy flow file ({why[0]})", source=str(path))
    return list(read_shape_lines(done.stdout.splitlines(), f"{path} (as read by mitmproxy)"))
