"""
A `YOUR-…` value left in a rules file is a warning: `receipts rules check` prints it with its file
and line (and still passes: the rule is valid), and the proxy logs it at each load. Comments may say
what to write in place of a value and are not read. The shipped packs hold no placeholder.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from proxy_addon.cli import main
from proxy_addon.rules.placeholders import placeholders
from tests.conftest import TEST_RULES, Proxy, wait_for

ROOT = Path(__file__).resolve().parent.parent

PLACEHOLDER_RULES = """\
api: team
hosts: [team.test]
# replace YOUR-COMMENTED-THING: comments are not read
operations:
  posts.create:
    match: {method: POST, path: /posts}
    fingerprint: {body: [title]}
    reconcile:
      read: {method: GET, url: "/posts?author=YOUR-TEAM-ID&per_page=100"}
      find: {title: "{intent.title}"}
      absence_provable: false
"""


def test_a_placeholder_in_a_value_is_named_with_its_line_and_a_comment_is_not(tmp_path):
    path = tmp_path / "team.yaml"
    path.write_text(PLACEHOLDER_RULES)
    (warning,) = placeholders(path)
    assert warning.startswith(f"{path}:9: placeholder YOUR-TEAM-ID left in a value")
    assert "COMMENTED" not in warning


def test_rules_check_warns_of_a_placeholder_and_passes(tmp_path, capsys):
    path = tmp_path / "team.yaml"
    path.write_text(PLACEHOLDER_RULES)
    assert main(["rules", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert f"ok  {path}: 1 operations" in out
    assert f"warning: {path}:9: placeholder YOUR-TEAM-ID left in a value" in err


def test_the_shipped_packs_need_no_placeholder(capsys):
    assert placeholders(ROOT / "rules") == []
    assert main(["rules", "check", str(ROOT / "rules")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_proxy_logs_a_placeholder_at_load_and_at_reload(tmp_path, confdir):
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(TEST_RULES / "test-api.yaml", rules / "test-api.yaml")
    (rules / "team.yaml").write_text(PLACEHOLDER_RULES)
    proxy = Proxy(tmp_path, confdir, rules=rules).start()
    try:
        assert f"{rules / 'team.yaml'}:9: placeholder YOUR-TEAM-ID left in a value" in proxy.log()
        (rules / "other.yaml").write_text(PLACEHOLDER_RULES.replace("team", "other").replace("TEAM", "OTHER"))
        wait_for(lambda: "placeholder YOUR-OTHER-ID" in proxy.log(), timeout=60, what="the reload's warning")
        assert f"{rules / 'other.yaml'}:9: placeholder YOUR-OTHER-ID left in a value" in proxy.log()
    finally:
        proxy.stop()
