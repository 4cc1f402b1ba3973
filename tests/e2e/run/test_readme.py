"""
The README and the docs work as written.

Every ```sh block of README.md and docs/*.md is either run here (or by the test named in
SHELL_BLOCKS) or listed there with why it is not: `test_every_shell_block_is_run_or_says_why_not`
fails on a block nobody accounted for, wherever a block moves.

`test_try_it_by_hand_as_written` takes the sh block of README.md's "Try it by hand" section
and runs it with bash, as a newcomer pastes it, changing only what must change for a test:
  - the ports 9000 (the test API) and 8080 (the proxy) in its text, and scripts/run's defaults
    8080/8081 through RECEIPT_PROXY_PORT / RECEIPT_PROXY_WEB_PORT, to free ports;
  - `.venv/bin/` to the directory of the Python running the tests (in a checkout: the same
    `.venv`), with RECEIPT_PROXY_VENV pointing scripts/run at that venv and PYTHONPATH at this
    checkout (so a venv installed from another checkout runs this one's code);
  - HOME and TMPDIR to temporary directories (mitmproxy's CA, `mktemp -d`), and any literal
    `/tmp/` to that TMPDIR.
The environment is a newcomer's that would make a careless block bypass the proxy:
NO_PROXY names 127.0.0.1 and http_proxy points at a closed port. The block runs in its own
process group, which is killed at the end (the API and scripts/run stay in the background).
The other blocks run the same way: docs/agents.md's MCP example, docs/fleet.md's fleet,
docs/running.md's plain mitmdump line, and README's `receipts demo`.

The other tests check the README's curl CA row, and scripts/run's banner line for curl, with
the real curl through a real proxy to a real HTTPS upstream.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import certifi
import pytest
import requests

from tests.conftest import ROOT, TEST_RULES, deadline, wait_for
from tests.e2e.processes import ScriptsRun
from tests.upstream import free_port

README = ROOT / "README.md"
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent

# Every section of README.md and docs/*.md that holds ```sh blocks: the test that runs them, or why not.
SHELL_BLOCKS = {
    (
        "README.md",
        "The two commands",
    ): "not run: scripts/run and scripts/test themselves (tests/e2e/run/test_scripts_run.py)",
    ("README.md", "Try it by hand"): "test_try_it_by_hand_demo_as_written, test_try_it_by_hand_as_written",
    ("README.md", "Point an agent at it"): "not run: variables for the reader's shell; test_the_readme_curl_ca_row_...",
    ("docs/running.md", "The plain mitmproxy way"): "test_the_plain_mitmproxy_way_as_written",
    ("docs/fleet.md", "Run a fleet"): "test_run_a_fleet_as_written",
    ("docs/agents.md", "Agents that use MCP servers"): "test_agents_that_use_mcp_servers_as_written",
    ("docs/operations.md", "The receipts CLI"): "not run: example receipt ids; each command is tested in tests/cli/",
    (
        "docs/operations.md",
        "Approvals",
    ): "the Scripts recipe: tests/e2e/run/test_approval.py; the CLI lines: example ids",
    (
        "docs/operations.md",
        "Shadow mode: try it before trusting it",
    ): "not run: needs a proxy's database; tests/e2e/proxy/test_observe_mode.py runs receipts report on one",
    (
        "docs/rules.md",
        "Start from a draft",
    ): "not run: the reader's own document or traffic; tests/draft/ drafts from the real documents, "
    "tests/e2e/draft/test_flows_session.py from a recorded session",
    ("docs/packs.md", "Make one your own"): "not run: an example body; `rules check`, `explain`: tests/cli/",
    ("docs/benchmarks.md", "scripts/bench"): "not run: minutes long; scripts/bench checks its own answers",
    (
        "docs/fleet.md",
        "The soak (minutes of traffic, faults and restarts)",
    ): "not run: minutes long; tests/e2e/proxy/test_soak.py runs a 2-minute soak",
    ("docs/benchmarks.md", "PostgreSQL: the addon on a shared store, and a fleet behind HAProxy"): "not run: as above",
}


def section(path: Path, heading: str) -> str:
    """The text of the `## heading` section of a Markdown file, up to the next `#` or `##` heading outside a
    code block; fails the test if there is none."""
    lines, in_fence, found = [], False, False
    for line in path.read_text().splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        elif not in_fence and re.match(r"#{1,2} ", line):
            if found:
                break
            found = line.rstrip("\n") == f"## {heading}"
            continue
        if found:
            lines.append(line)
    if not found:
        pytest.fail(f"{path.relative_to(ROOT)} has no '## {heading}' section (this test runs what it shows)")
    return "".join(lines)


SH_BLOCK = re.compile(r"^([ \t]*)```sh\n(.*?)^\1```", re.S | re.M)


def sh_blocks(path: Path, heading: str) -> list[str]:
    """The ```sh blocks of a section, each without the indentation of its fence."""
    blocks = []
    for m in SH_BLOCK.finditer(section(path, heading)):
        indent = m.group(1)
        blocks.append("".join(line.removeprefix(indent) for line in m.group(2).splitlines(keepends=True)))
    return blocks


def sh_block(path: Path, heading: str, containing: str = "") -> str:
    """The one ```sh block of a section that contains `containing`."""
    found = [b for b in sh_blocks(path, heading) if containing in b]
    if len(found) != 1:
        pytest.fail(
            f"{path.relative_to(ROOT)}'s '## {heading}' section has {len(found)} ```sh blocks with "
            f"{containing!r}, not one"
        )
    return found[0]


def shell_block_sections() -> dict[tuple[str, str], int]:
    """(file, heading of the `#`/`##` section it is in) → how many ```sh blocks, for README.md and docs/*.md."""
    found: dict[tuple[str, str], int] = {}
    for path in [README, *sorted(DOCS.glob("*.md"))]:
        heading = ""
        text = path.read_text()
        for m in re.finditer(r"^(#{1,2}) (.+)$|^[ \t]*```sh$", text, re.M):
            in_fence = text[: m.start()].count("```") % 2 == 1  # a `# comment` inside a block is no heading
            if m.group(2) and not in_fence:
                heading = m.group(2)
            elif not m.group(2) and not in_fence:
                key = (str(path.relative_to(ROOT)), heading)
                found[key] = found.get(key, 0) + 1
    return found


def test_every_shell_block_is_run_or_says_why_not():
    """A block that moves, or a new one, must be named in SHELL_BLOCKS: run by a test, or said why not."""
    found = shell_block_sections()
    assert set(found) == set(SHELL_BLOCKS), (
        f"sh blocks nobody accounts for: {sorted(set(found) - set(SHELL_BLOCKS))}; "
        f"listed but gone: {sorted(set(SHELL_BLOCKS) - set(found))}"
    )


def substitute(text: str, old: str, new: str) -> str:
    """Replace `old` (a port: as a whole number) with `new`; fail if the block does not contain it."""
    pattern = rf"(?<!\d){re.escape(old)}(?!\d)" if old.isdigit() else re.escape(old)
    out, n = re.subn(pattern, lambda _: new, text)
    if not n:
        pytest.fail(f"a README.md or docs/ block no longer contains {old!r}; update tests/e2e/run/test_readme.py")
    return out


def group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. A zombie does not count: the block's background jobs are
    reparented when its shell ends, and whoever adopts them (a container's PID 1) may never reap them."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp
            return True
    return False


def kill_group(pgid: int) -> None:
    """SIGTERM the process group (the block's background jobs), then SIGKILL what is left after 15 s."""
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.1)
    raise AssertionError(f"process group {pgid} still alive after SIGKILL")


def receipts_rows(out: str) -> list[dict[str, str]]:
    """The rows `receipts list` printed, by column name."""
    lines = out.splitlines()
    starts = [i for i, line in enumerate(lines) if line.split()[:4] == ["ID", "AGE", "OPERATION", "STATE"]]
    assert starts, f"no `receipts list` table in the block's output:\n{out}"
    names = lines[starts[-1]].split()
    rows = []
    for line in lines[starts[-1] + 1 :]:
        cells = line.split()
        if len(cells) != len(names) or not re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]+", cells[0]):
            break
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


def test_try_it_by_hand_as_written(tmp_path):
    up_port, proxy_port, web_port = free_port(), free_port(), free_port()
    # A newcomer's shell that would send a careless curl straight to the API (also NO_PROXY: run_block).
    block = sh_block(README, "Try it by hand", "tests/upstream.py")
    ports = {"9000": str(up_port), "8080": str(proxy_port)}
    careless = {"http_proxy": f"http://127.0.0.1:{free_port()}"}
    with run_block(tmp_path, block, ports, proxy_port, web_port, env=careless) as text:
        # What the two curls got: the write's 502, then the retry's 409, both naming the one receipt.
        statuses = re.findall(r"^HTTP/1\.1 (\d{3})", text, re.M)
        assert statuses == ["502", "409"], text
        states = re.findall(r"^X-Receipt-State: (\S+)", text, re.M | re.I)
        assert states == ["outcome_unknown", "outcome_unknown"], text
        assert '"error": "outcome_unknown"' in text and '"error": "duplicate_unresolved"' in text, text
        ids = set(re.findall(r"^X-Receipt-Id: (\S+)", text, re.M | re.I))
        assert len(ids) == 1, text

        # `receipts list`: that receipt, its outcome unknown, and the duplicate it blocked.
        rows = receipts_rows(text)
        assert [(r["ID"], r["OPERATION"], r["STATE"], r["BLOCKED"]) for r in rows] == [
            (ids.pop(), "local/things.create", "outcome_unknown", "1")
        ], text

        # The API itself: exactly one write, with the intent's title.
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with direct.open(f"http://127.0.0.1:{up_port}/api/things", timeout=10) as r:
            things = json.loads(r.read())
        assert [t["title"] for t in things] == ["hi"], things
        # The Web UI line the prose after the block points to, with its token.
        assert re.search(rf"^Web UI: http://127\.0\.0\.1:{web_port}/\?token=[0-9a-f]{{32}} ", text, re.M), text


def checkout_state() -> set[str]:
    """What a careless command would leave in the checkout (where it runs): receipts databases, keys, instances."""
    return {p.name for n in ("*.db", "*.db-*", "*.db.*", "secret.key") for p in ROOT.glob(n)}


def test_try_it_by_hand_demo_as_written(tmp_path):
    """README "Try it by hand": `receipts demo` as written tells the story, exits 0 and leaves no state here."""
    before = checkout_state()
    block = sh_block(README, "Try it by hand", "receipts demo")
    with run_block(tmp_path, block, {}, free_port(), free_port(), check_exit=True) as text:
        pass
    assert "outcome_unknown" in text, text
    assert checkout_state() == before


def test_the_plain_mitmproxy_way_as_written(tmp_path):
    """
    docs/running.md "The plain mitmproxy way": the mitmdump line as written (its port a free one) listens on
    127.0.0.1 only and keeps its receipts and key in ~/.local/state/receipt-proxy, never in the checkout.
    """
    port = free_port()
    block = sh_block(DOCS / "running.md", "The plain mitmproxy way")
    assert block.count("\n") == 1, block  # one command line, which stays in the foreground
    before = checkout_state()
    script, environ = tmp_path / "block.sh", block_env(tmp_path, port, free_port())
    script.write_text(substitute(substitute(block, "8080", str(port)), ".venv/bin/", f"{BIN}/"))
    log = tmp_path / "out.txt"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", str(script)],
            cwd=ROOT,
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:

        def ready() -> bool:
            assert proc.poll() is None, log.read_text(errors="replace")
            return "receipt-proxy: ready (recording)" in log.read_text(errors="replace")

        wait_for(ready, timeout=120, what=f"the mitmdump line to be ready (log: {log})")
        text = log.read_text(errors="replace")
        assert f"HTTP(S) proxy listening at 127.0.0.1:{port}." in text, text
        state = tmp_path / "home" / ".local" / "state" / "receipt-proxy"
        assert (state / "receipts.db").is_file() and (state / "secret.key").is_file(), text
        assert checkout_state() == before
    finally:
        kill_group(proc.pid)


@contextlib.contextmanager
def run_block(
    tmp_path: Path,
    block: str,
    ports: dict[str, str],
    proxy_port: int,
    web_port: int,
    env: dict[str, str] | None = None,
    check_exit: bool = False,
) -> Iterator[str]:
    """Run a README or docs sh block as written (ports and paths changed as the module docstring says), and give
    its output; what it left running in the background (its process group) is stopped when the `with` ends.
    With `check_exit`, the block must exit 0."""
    block = block.replace("/tmp/", f"{tmp_path}/tmp/")
    for old, new in (*ports.items(), (".venv/bin/", f"{BIN}/")):
        block = substitute(block, old, new)
    script = tmp_path / "block.sh"
    script.write_text(block)
    environ = {**block_env(tmp_path, proxy_port, web_port), **(env or {})}
    log = tmp_path / "out.txt"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", str(script)],
            cwd=ROOT,
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        try:
            proc.wait(timeout=deadline(90))
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the block did not finish in {deadline(90):.0f} s:\n{log.read_text(errors='replace')}"
            ) from None
        if check_exit:
            assert proc.returncode == 0, f"the block exited {proc.returncode}:\n{log.read_text(errors='replace')}"
        yield log.read_text(errors="replace")
    finally:
        kill_group(proc.pid)


def block_env(tmp_path: Path, proxy_port: int, web_port: int) -> dict[str, str]:
    """A newcomer's environment for a block (module docstring), with HOME and TMPDIR in tmp_path."""
    (tmp_path / "home").mkdir()
    (tmp_path / "tmp").mkdir()
    environ = {
        **os.environ,
        "RECEIPT_PROXY_PORT": str(proxy_port),
        "RECEIPT_PROXY_WEB_PORT": str(web_port),
        "RECEIPT_PROXY_METRICS": "127.0.0.1:0",  # scripts/run's 9464 may be another run's
        "RECEIPT_PROXY_VENV": sys.prefix,
        "PYTHONPATH": str(ROOT),
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "tmp"),
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "PYTHONUNBUFFERED": "1",
    }
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "RECEIPT_PROXY_STATE_DIR",
        "RECEIPT_PROXY_DB",
        "RECEIPT_PROXY_RULES",
        "SSL_CERT_FILE",
    ):
        environ.pop(name, None)
    return environ


def test_agents_that_use_mcp_servers_as_written(tmp_path):
    """docs/agents.md "Agents that use MCP servers": the SDK's client through scripts/run; one issue, the retry
    blocked."""
    mcp_port, proxy_port, web_port = free_port(), free_port(), free_port()
    with run_block(
        tmp_path,
        sh_block(DOCS / "agents.md", "Agents that use MCP servers"),
        {"9100": str(mcp_port), "8080": str(proxy_port)},
        proxy_port,
        web_port,
    ) as text:
        pass
    call = re.search(r"^call: isError=True: (.*)$", text, re.M)
    retry = re.search(r"^retry: isError=True: (.*)$", text, re.M)
    assert call and retry, text
    assert "answer was lost" in call.group(1), text
    assert retry.group(1).startswith(
        "NOT SENT: this call to create_issue duplicates"
    ) and "outcome is unknown" in retry.group(1), text
    ids = set(re.findall(r"\(receipt (\S+)\)", call.group(1) + retry.group(1)))
    assert len(ids) == 1, text
    rows = receipts_rows(text)
    assert [(r["ID"], r["OPERATION"], r["STATE"], r["BLOCKED"]) for r in rows] == [
        (ids.pop(), "tracker/issues.create", "outcome_unknown", "1")
    ], text
    assert re.search(r"^1 issue created$", text, re.M), text


def test_run_a_fleet_as_written(tmp_path, pg_url, upstream, bucket):
    """docs/fleet.md "Run a fleet": two proxies on one PostgreSQL behind HAProxy, started by the block as written
    (its ports, its database URL and the recipe's ports replaced by the test's); identical writes through
    HAProxy's one address make one upstream write."""
    haproxy = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if haproxy is None:
        pytest.skip("docs/fleet.md 'Run a fleet' not run: haproxy is not installed (apt-get install haproxy)")
    block = sh_block(DOCS / "fleet.md", "Run a fleet")
    ports = {old: str(free_port()) for old in ("8080", "8090", "8092", "9464", "9465")}
    recipe = (ROOT / "docs" / "fleet" / "haproxy.cfg").read_text()
    for old, new in ports.items():
        block = substitute(block, old, new) if old != "8080" else block
        recipe = substitute(recipe, old, new) if old in ("8080", "8090", "8092") else recipe
    (tmp_path / "haproxy.cfg").write_text(recipe)
    block = substitute(block, "docs/fleet/haproxy.cfg", str(tmp_path / "haproxy.cfg"))
    block = substitute(block, "postgresql://proxy@db.internal/receipts", pg_url)
    script = tmp_path / "run-a-fleet.sh"
    script.write_text(block)
    (tmp_path / "home").mkdir()
    env = {
        **os.environ,
        "RECEIPT_PROXY_RULES": str(TEST_RULES),
        "RECEIPT_PROXY_VENV": sys.prefix,
        "PYTHONPATH": str(ROOT),
        "HOME": str(tmp_path / "home"),
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("RECEIPT_PROXY_STATE_DIR", "RECEIPT_PROXY_DB", "RECEIPT_PROXY_PORT", "RECEIPT_PROXY_METRICS"):
        env.pop(name, None)
    log = tmp_path / "out.txt"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", str(script)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    front = f"http://127.0.0.1:{ports['8080']}"
    path = f"/api/{bucket}/plain"
    try:

        def ready() -> bool:
            assert proc.poll() is None, log.read_text(errors="replace")
            text = log.read_text(errors="replace")
            # HAProxy may start first and mark a proxy DOWN: then wait for its check to see it UP.
            return text.count("receipt-proxy: ready (recording)") == 2 and text.count(" is UP") >= text.count(
                " is DOWN"
            )

        wait_for(ready, timeout=90, what=f"both proxies of the block to be ready (log: {log})")
        upstream.plan(path, "held")
        answers: list = [None] * 8

        def send(i: int) -> None:
            answers[i] = requests.post(
                upstream.url + path, json={"title": "one fleet write"}, timeout=30, proxies={"http": front}
            )

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(answers))]
        for t in threads:
            t.start()
        wait_for(lambda: upstream.seen(path) == 1, timeout=30, what="the first write to reach the upstream")
        time.sleep(1.0)
        upstream.let_go(path)
        for t in threads:
            t.join(timeout=40)
        assert upstream.seen(path) == 1 and upstream.commits(path) == 1
        assert {a.status_code for a in answers} <= {201, 409}, [a.status_code for a in answers]
        assert len({a.headers.get("x-receipt-id") for a in answers}) == 1
    finally:
        upstream.let_go(path)
        kill_group(proc.pid)


CA_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE", "CURL_CA_PATH")


def curl_through(proxy_url: str, url: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """
    The real curl through `proxy_url`, in an environment that already names a CA bundle for curl,
    as many do (Debian-based images often set CURL_CA_BUNDLE): certifi's, which vouches for
    neither the proxy's CA nor the test upstream's certificate. `env` comes on top.
    """
    base = {k: v for k, v in os.environ.items() if k not in CA_VARIABLES}
    base["CURL_CA_BUNDLE"] = certifi.where()
    return subprocess.run(
        [
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-x",
            proxy_url,
            "--noproxy",
            "",
            "--max-time",
            "10",
            *args,
            url,
        ],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_readme_curl_ca_row_makes_curl_trust_the_proxy(proxy, tls_upstream, unruled_tls_upstream, tmp_path):
    """The row's variable and its --cacert, with the real curl through the proxy to an intercepted HTTPS host."""
    row = [line for line in section(README, "Point an agent at it").splitlines() if line.startswith("| curl |")]
    assert len(row) == 1, "README.md's 'Point an agent at it' table has no single '| curl |' row"
    found = re.findall(r"`export (\w+)=\$CA`", row[0])
    assert found, row[0]
    assert "`curl --cacert $CA" in row[0], row[0]
    url = f"https://127.0.0.1:{tls_upstream.port}/readme-ca-check"  # 127.0.0.1 is ruled: intercepted
    for name in found:
        p = curl_through(proxy.url, url, [], {name: str(proxy.ca)})
        assert (p.returncode, p.stdout) == (0, "200"), f"curl with {name}=$CA: exit {p.returncode}: {p.stderr}"
    p = curl_through(proxy.url, url, ["--cacert", str(proxy.ca)], {})
    assert (p.returncode, p.stdout) == (0, "200"), p.stderr
    # Without them, curl refuses the proxy's certificate: the check above is the CA's doing.
    p = curl_through(proxy.url, url, [], {})
    assert p.returncode == 60, (p.returncode, p.stderr)

    # The note under the table: $CA alone does not vouch for a host the proxy tunnels (127.0.0.2
    # is in no rule), whose own CA stands for the public ones here; a bundle of both serves both.
    tunnelled = f"https://127.0.0.2:{unruled_tls_upstream.port}/readme-ca-check"
    p = curl_through(proxy.url, tunnelled, [], {found[0]: str(proxy.ca)})
    assert p.returncode == 60, (p.returncode, p.stderr)
    bundle = tmp_path / "ca-bundle.pem"
    bundle.write_bytes(unruled_tls_upstream.cert_path.read_bytes() + proxy.ca.read_bytes())
    for target in (url, tunnelled):
        p = curl_through(proxy.url, target, [], {found[0]: str(bundle)})
        assert (p.returncode, p.stdout) == (0, "200"), f"{target}: exit {p.returncode}: {p.stderr}"


def test_the_banner_curl_line_makes_curl_trust_the_proxy(proxy, tls_upstream, tmp_path, confdir):
    """scripts/run's banner line for curl names a variable the real curl honours."""
    run = ScriptsRun(tmp_path, confdir, ("--headless",))
    try:
        run.start()
    finally:
        run.stop()
    curl = [line for line in run.log().splitlines() if re.search(r"#\s*curl\b", line)]
    assert len(curl) == 1, run.log()
    m = re.fullmatch(r"\s*export (\w+)=~/\.mitmproxy/mitmproxy-ca-cert\.pem\s+#.*", curl[0])
    assert m, curl[0]
    url = f"https://127.0.0.1:{tls_upstream.port}/banner-ca-check"  # through the shared proxy: the same CA
    p = curl_through(proxy.url, url, [], {m.group(1): str(proxy.ca)})
    assert p.returncode == 0 and p.stdout == "200", f"curl with {m.group(1)}=CA: exit {p.returncode}: {p.stderr}"
