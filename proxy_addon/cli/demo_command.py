"""
`receipts demo`: the story receipt-proxy exists for, acted out in a few seconds on 127.0.0.1.

Three real parts: the proxy (cli/demo_proxy.py: this venv's mitmdump with the addon), a tiny API
(cli/demo_api.py: it commits the first write and then drops the connection, and fails the first read)
and an agent (an httpx client sending through the proxy). The steps, each checked as it happens (a
step that goes otherwise stops the demo with exit status 1):

    1. the write: the API commits it, the connection drops    502 outcome_unknown
    2. the agent's retry: the proxy reads first, the read     409 duplicate_unresolved, not sent
       fails (503), and a failed read proves nothing
    3. a read that settles it: `receipts reconcile ID`        outcome_unknown → succeeded
    4. the agent's next retry, answered from the receipt      409 duplicate_succeeded, not sent

Why step 4 is not a replay: a success found by a read has no answer of its own (the API's answer
was lost with the connection), and the proxy never passes another answer off as the API's; the
agent is told that the write already succeeded, with the id the read found.

Everything lives in a temporary directory (receipts.db, secret.key, the rules, mitmproxy's CA,
the proxy's log) removed at the end; the client, the proxy and the API are stopped, in that order,
however the demo ends.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from proxy_addon.cli.demo_api import DemoApi
from proxy_addon.cli.demo_proxy import DemoProxy
from proxy_addon.errors import ReceiptsError

TITLE = "Quarterly report"
RULES = """\
api: demo
hosts: [127.0.0.1]
operations:
  things.create:
    match: {method: POST, path: /things}
    fingerprint: {body: [title]}        # the intent: the JSON body's title
    external_id: id                     # what names the thing a write made
    reconcile:                          # how to look for a write's effect: a read, never a second write
      read: {method: GET, url: /things}
      find: {title: "{intent.title}"}
      absence_provable: true            # the list is complete: not found there would prove absence
      retry_when_absent: true
      external_id: id
"""
WIDTH = 100  # columns of the wrapped lines
CLI_WAIT = 120.0  # seconds `receipts reconcile` may take (a loaded machine)
RETRY_AFTER_MAX = 10.0  # seconds the demo waits for a failed read's Retry-After (the API says 1)

DESCRIPTION = """\
Act out, in a few seconds and on 127.0.0.1 only, the story receipt-proxy exists for:

  1. An agent's write reaches the API, which commits it; then the connection drops before
     the answer. The agent gets 502 outcome_unknown: nobody can tell whether it happened.
  2. The agent retries. The proxy holds the first attempt's receipt, so it looks with a read
     first; the API, not recovered yet, answers that read 503: a failed read proves nothing,
     and the retry is not sent (409 duplicate_unresolved).
  3. A read settles the receipt: `receipts reconcile ID` finds the thing → succeeded.
  4. The agent retries again and is answered from the receipt, nothing sent: 409
     duplicate_succeeded with the id the read found. (Not a replay: a success found by a
     read has no answer of its own to replay; the API's was lost with the connection.)

After each step it prints what the agent got and how many writes the API committed: 1.

It runs the real parts: this venv's mitmdump with the addon (a port the kernel picks), a
tiny API of its own (POST /things, GET /things) and an httpx client as the agent, all on
127.0.0.1. Its state (receipts.db, secret.key, rules, mitmproxy's CA) lives in a temporary
directory removed at the end; every process and thread it starts is stopped before it
exits. Your receipts database, rules and ~/.mitmproxy are not touched.
Exit status 0 when the story went as told, 1 if a step went otherwise (it says which).
In a checkout, after scripts/run or scripts/test has made .venv: .venv/bin/receipts demo
The same story by hand, with curl and scripts/run: README.md, "Try it by hand".
"""


class OffScript(ReceiptsError):
    """A step of the demo went otherwise than the story says."""


@dataclass
class Story:
    api: DemoApi
    proxy: DemoProxy
    agent: httpx.Client
    rules: Path
    receipt: str = ""
    retry_at: dt.datetime | None = None


def demo_args(p: argparse.ArgumentParser) -> None:
    """No options: the demo is the same every time."""


def demo_run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="receipts-demo-") as tmp:
        work = Path(tmp)
        rules = work / "rules.yaml"
        rules.write_text(RULES)
        print("receipts demo: an agent, receipt-proxy and an API, all on 127.0.0.1")
        print(f"  its files: {work} (removed at the end)")
        with DemoApi() as api:
            print(f"  the API:   {api.url} (POST /things commits a thing, GET /things lists them)")
            with DemoProxy(work, rules) as proxy:
                print(f"  the proxy: {proxy.url} (mitmdump, pid {proxy.pid}), with this rule:")
                print("".join(f"      {line}\n" for line in RULES.splitlines()), end="")
                with httpx.Client(proxy=proxy.url, trust_env=False, timeout=60) as agent:
                    story = Story(api, proxy, agent, rules)
                    for step in (write_dropped, retry_blocked, read_settles, retry_answered):
                        print()
                        step(story)
            writes = api.writes
    print()
    print(f"The API committed {writes} write; the agent sent it 3 times. The proxy, the API and the")
    print("client are stopped, and the demo's directory is removed.")
    return 0


def write_dropped(s: Story) -> None:
    print(f'1. The agent creates a thing: POST /things {{"title": "{TITLE}"}}. The API commits it,')
    print("   then the connection drops before its answer.")
    body = expect(s, send(s), 502, "outcome_unknown")
    s.receipt = body["operation_id"]
    say(f"agent gets: 502 {body['error']}: {body['hint']}")
    print(f"   receipt {s.receipt}: {body['state']}   the API's writes: {s.api.writes}")


def retry_blocked(s: Story) -> None:
    print("2. The agent retries the same write. Its receipt's outcome is unknown, so the proxy reads")
    print("   first (GET /things); the API, not recovered yet, answers 503 with Retry-After: 1. A failed")
    print("   read proves nothing, so the retry is not sent.")
    answer = send(s)
    body = expect(s, answer, 409, "duplicate_unresolved")
    s.retry_at = dt.datetime.fromisoformat(body["retry_after"])
    print(f"   agent gets: 409 {body['error']} (Retry-After: {answer.headers.get('retry-after')})")
    say(body["hint"], indent=5)
    print(f"   receipt {s.receipt}: {body['state']}   the API's writes: {s.api.writes}")


def read_settles(s: Story) -> None:
    print("3. A read settles it. Once the Retry-After has passed, the operator (or a cron job) runs")
    print(f"   receipts reconcile {s.receipt}")
    print("   (the proxy too reads again by itself, at the first retry after the Retry-After)")
    if s.retry_at is not None:
        wait = (s.retry_at - dt.datetime.now(dt.UTC)).total_seconds()
        time.sleep(min(max(wait, 0.0) + 0.05, RETRY_AFTER_MAX))
    command = [sys.executable, "-m", "proxy_addon.cli", "--db", str(s.proxy.db)]
    command += ["reconcile", s.receipt, "--rules", str(s.rules)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CLI_WAIT, stdin=subprocess.DEVNULL)
    for line in (done.stdout + done.stderr).splitlines():
        print(f"     {line}")
    if done.returncode != 0 or "→ succeeded" not in done.stdout:
        raise OffScript(f"step 3: receipts reconcile did not find the write (exit status {done.returncode})")
    print(f"   the read found the thing the first write made; the API's writes: {s.api.writes}")


def retry_answered(s: Story) -> None:
    print("4. The agent retries once more. The receipt says succeeded, so the proxy answers from it and")
    print("   sends nothing. Not a replay: the API's own answer was lost with the connection, and a")
    print("   success found by a read is never passed off as the API's answer. The agent is told it")
    print("   already succeeded, with the id the read found:")
    body = expect(s, send(s), 409, "duplicate_succeeded")
    say(f"agent gets: 409 {body['error']}, external_id {body['external_id']}: {body['hint']}")
    print(f"   receipt {s.receipt}: {body['state']}   the API's writes: {s.api.writes}")


def say(text: str, *, indent: int = 3) -> None:
    """A line of what happened, wrapped to fit a terminal, its continuation lines indented further."""
    print(textwrap.fill(text, WIDTH, initial_indent=" " * indent, subsequent_indent=" " * (indent + 2)))


def send(s: Story) -> httpx.Response:
    """The agent's write, through the proxy, as JSON."""
    return s.agent.post(f"{s.api.url}/things", json={"title": TITLE})


def expect(s: Story, answer: httpx.Response, status: int, error: str) -> dict:
    """The answer's JSON body, if it is the `status` with `error` the story says, and the API has one write."""
    try:
        body = answer.json()
    except json.JSONDecodeError:
        body = {}
    if answer.status_code != status or not isinstance(body, dict) or body.get("error") != error:
        raise OffScript(
            f"expected {status} {error}, the agent got {answer.status_code}: {answer.text[:300]}"
            f"\n  the proxy's log: {s.proxy.log_path} (removed at exit):\n{s.proxy.log()[-2000:]}"
        )
    if s.api.writes != 1:
        raise OffScript(f"the API committed {s.api.writes} writes, not 1")
    return body
