"""The table of subcommands: for each, its help, a function adding its arguments and one running it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from proxy_addon.cli.approval_commands import approve_args, approve_run, deny_args, deny_run, pending_args, pending_run
from proxy_addon.cli.budget_command import budgets_args, budgets_run
from proxy_addon.cli.demo_command import DESCRIPTION as DEMO_DESCRIPTION
from proxy_addon.cli.demo_command import demo_args, demo_run
from proxy_addon.cli.enforcement_report import report_args, report_run
from proxy_addon.cli.receipt_commands import (
    blocked_args,
    blocked_run,
    export_args,
    export_run,
    list_args,
    list_run,
    prune_args,
    prune_run,
    show_args,
    show_run,
)
from proxy_addon.cli.reconcile_command import reconcile_args, reconcile_run
from proxy_addon.cli.resolve_command import resolve_args, resolve_run
from proxy_addon.cli.rules_commands import rules_args, rules_run
from proxy_addon.cli.verify_command import verify_args, verify_run
from proxy_addon.store import ReceiptStore


@dataclass(frozen=True)
class _Described:
    help: str
    description: str
    examples: list[str]
    add_arguments: Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class Command(_Described):
    """A subcommand on the receipts database: `run` gets the open store."""

    run: Callable[[ReceiptStore, argparse.Namespace], int]
    uses_store: ClassVar[bool] = True


@dataclass(frozen=True)
class StorelessCommand(_Described):
    """A subcommand that runs without a receipts database (`rules`)."""

    run: Callable[[argparse.Namespace], int]
    uses_store: ClassVar[bool] = False


COMMANDS: dict[str, Command | StorelessCommand] = {
    "list": Command(
        "list receipts, newest first",
        "List receipts, newest first, with how many duplicates each blocked or replayed.\n"
        "AGE is the time since the request was submitted.",
        [
            "receipts list",
            "receipts list --state outcome_unknown --state manual_review",
            "receipts list --operation dev.to/articles.create --since 7d",
            "receipts list --since 2026-11-01T12:00:00Z --limit 10 --json",
        ],
        list_args,
        list_run,
    ),
    "show": Command(
        "one receipt, its history, decisions and duplicates",
        "One receipt: its fields, its state changes, the decisions applied to it and who made them (a\n"
        "rule's deny, a budget's refusal, an approval or a denial, a timeout, what observe mode would\n"
        "have done, a read's verdict, a resolution), and the blocked or replayed duplicates of it.",
        ["receipts show 20261129T184210Z-1fd54b31a2", "receipts show 20261129T184210Z-1fd54b31a2 --json"],
        show_args,
        show_run,
    ),
    "blocked": Command(
        "duplicates the proxy blocked or replayed, newest first",
        "Duplicates the proxy blocked or answered with a recorded response (replayed), newest first,\n"
        "each with the receipt it was checked against and that receipt's current state.",
        ["receipts blocked", "receipts blocked --since 2h", "receipts blocked --since 2026-11-01 --json"],
        blocked_args,
        blocked_run,
    ),
    "report": Command(
        "what enforcement did, or in observe mode would have done",
        "Per api and operation since a time: the writes recorded, the duplicates blocked and\n"
        "replayed, the writes held for approval, denied or refused, with a few receipt ids each,\n"
        "from the receipts' events. In observe mode (receipts_mode=observe) those writes were\n"
        "sent: their counts say 'N would' (what enforcement would have done).",
        ["receipts report", "receipts report --since 1h", "receipts report --since 2026-11-01T12:00:00Z --json"],
        report_args,
        report_run,
    ),
    "resolve": Command(
        "settle an outcome_unknown or manual_review receipt by hand",
        "Record what you found out about a receipt whose outcome is unknown or under review.\n"
        "Until it is resolved, the proxy blocks identical requests; after safe_to_retry or\n"
        "rejected it forwards the next one as a retry. The change is recorded with your\n"
        "login name (actor cli:NAME) and the note.",
        [
            'receipts resolve 20261129T184210Z-1fd54b31a2 --as succeeded --note "article is live" '
            "--external-id 1234567",
            'receipts resolve 20261129T184210Z-1fd54b31a2 --as safe_to_retry --note "not on the dashboard after 1h"',
            'receipts resolve 20261129T184210Z-1fd54b31a2 --as rejected --note "support says it was refused"',
        ],
        resolve_args,
        resolve_run,
    ),
    "pending": Command(
        "writes held for approval, with their intent",
        "Writes held for approval (receipts in awaiting_approval), newest first: the operation, the\n"
        "principal (a keyed hash of the credential), the intent fingerprint and the sanitized intent\n"
        "the fingerprint was computed from. PROXY is the running proxy that holds the write, or\n"
        "`stopped`: nothing was sent, and that proxy's next start records it not_sent. DECISION is\n"
        "one recorded with approve or deny that the proxy has not applied yet.",
        ["receipts pending", "receipts pending --json | jq -r '.[].operation_id'"],
        pending_args,
        pending_run,
    ),
    "approve": Command(
        "approve a write held for approval: the proxy sends it",
        "Approve a write held for approval, as mitmweb's Resume does, from any terminal: the\n"
        "decision is recorded in the receipts database, and the proxy that holds the write sends\n"
        "it within a second (the receipt becomes submitted). Recorded with your login name (actor\n"
        "cli:NAME) and the note. Refused, writing nothing, for a receipt that is not awaiting\n"
        "approval, already decided, held by a proxy that has stopped, or (--fingerprint) of\n"
        "another intent. Waits --wait seconds for the proxy; exit status 1 if it did not apply\n"
        "the decision (someone decided first, or it did not act in time).",
        [
            "receipts approve 20261129T184210Z-1fd54b31a2",
            'receipts approve 20261129T184210Z-1fd54b31a2 --note "refund agreed with the customer"',
            "receipts approve 20261129T184210Z-1fd54b31a2 --fingerprint sha256:3f2a9c1b0d4e",
        ],
        approve_args,
        approve_run,
    ),
    "deny": Command(
        "deny a write held for approval: never sent, the agent gets 403",
        "Deny a write held for approval, as mitmweb's Abort does, from any terminal: the proxy\n"
        "that holds it answers the agent 403 denied_by_operator with your note within a second,\n"
        "and the receipt becomes rejected; nothing is sent. Recorded with your login name and\n"
        "the note. Refused as approve is; exit status 1 as approve.",
        ['receipts deny 20261129T184210Z-1fd54b31a2 --note "amount too high, ask finance"'],
        deny_args,
        deny_run,
    ),
    "reconcile": Command(
        "resolve unknown outcomes with a read, never another write",
        "Look for each receipt's effect with the read its rule's reconcile spec describes (GET or\n"
        "HEAD only): found → succeeded; absence proven and a retry allowed → safe_to_retry;\n"
        "a failed read proves nothing: outcome_unknown, next read not before its Retry-After or\n"
        "a backoff (manual_review after --read-attempts failed reads or past --read-deadline);\n"
        "anything else → manual_review. What was read is recorded in the receipt's history;\n"
        "credentials are used for the read and never stored. Exit status 1 if a read failed.",
        [
            "receipts reconcile 20261129T184210Z-1fd54b31a2",
            "receipts reconcile --all --timeout 10",
            "receipts reconcile --all --read-attempts 5 --read-deadline 48h",
            "receipts reconcile 20261129T184210Z-1fd54b31a2 --now",
            "receipts reconcile --all --header 'api-key: ...' --json",
            "receipts reconcile 20261129T184210Z-1fd54b31a2 --rules ./rules/dev.to.yaml",
        ],
        reconcile_args,
        reconcile_run,
    ),
    "budgets": Command(
        "the rules' budgets and their use now",
        "Each budget the rules declare (an operation's `budget:`), with its use in its current window,\n"
        "counted as the proxy counts it: the window's receipts of the budget that did not end rejected\n"
        "or not_sent, every proxy's that shares this database. Windows are fixed and aligned to UTC.\n"
        "A budget per principal lists the principals (keyed hashes of credentials) that used most.",
        ["receipts budgets", "receipts budgets --rules rules/ --top 10 --json"],
        budgets_args,
        budgets_run,
    ),
    "export": Command(
        "every receipt with its events, as JSON Lines",
        "Every receipt (oldest first) as one JSON object a line, with its events and the decisions\n"
        "applied to it (as `show --json` lists them; with --signed, on each receipt's line too).\n"
        "A recorded response appears as its status, size and whether it is encrypted (response_status,\n"
        "response_size, response_encrypted), never its headers or body.",
        ["receipts export > receipts.jsonl", "receipts export --since 30d | jq -c 'select(.state == \"succeeded\")'"],
        export_args,
        export_run,
    ),
    "verify": StorelessCommand(
        "check that the receipts' history is the one the proxy wrote",
        "Recompute the hash chain over every event (docs/proof.md), in the database or in a bundle\n"
        "of `export --signed`, check each signed checkpoint,\n"
        "and check each receipt's state against its last transition event. Prints one line:\n"
        "`intact: N events, last checkpoint at ...`, or the first record that breaks the chain and\n"
        "why (exit status 1).",
        [
            "receipts verify",
            "receipts verify --db receipts.db",
            "receipts verify --db postgresql://proxy@db/receipts",
            "receipts verify bundle.jsonl --public-key receipt-proxy+1a2b3c4d+AQ...",
        ],
        verify_args,
        verify_run,
    ),
    "rules": StorelessCommand(
        "check or draft rules, or explain what a request matches",
        "Rules tools: `check` validates files and prints every problem with file:line (and each\n"
        "`# TODO:` comment left, as a warning); `explain` shows what the proxy would do with a\n"
        "request, without sending it; `draft` drafts a rules file from an API's OpenAPI document.",
        [
            "receipts rules check",
            "receipts rules check rules/github.yaml my-rules/",
            "receipts rules explain POST https://api.github.com/repos/o/r/issues --body issue.json",
            "receipts rules draft --openapi openapi.yaml > rules/myapi.yaml",
        ],
        rules_args,
        rules_run,
    ),
    "demo": StorelessCommand(
        "act out the story the proxy exists for, on 127.0.0.1",
        DEMO_DESCRIPTION,
        ["receipts demo", "receipts demo | less"],
        demo_args,
        demo_run,
    ),
    "prune": Command(
        "delete old resolved receipts",
        "Delete resolved receipts (succeeded, rejected, not_sent, safe_to_retry) last changed more\n"
        "than AGE ago, with their events. Unresolved receipts are never deleted, nor a receipt\n"
        "that a kept receipt is a retry of.",
        ["receipts prune --older-than 90d --dry-run", "receipts prune --older-than 30d"],
        prune_args,
        prune_run,
    ),
}
