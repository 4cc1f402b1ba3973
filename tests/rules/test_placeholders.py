"""
A `YOUR-…` value left in a rules file is a warning (proxy_addon/rules/placeholders.py):
`receipts rules check` prints it with its file and line (and still passes: the rule is valid); the
proxy logs it at each load (tests/e2e/proxy/test_rules_reload.py). Comments may say
what to write in place of a value and are not read. The shipped packs hold no placeholder.
"""

from __future__ import annotations

from pathlib import Path

from proxy_addon.cli import main
from proxy_addon.rules.placeholders import placeholders

ROOT = Path(__file__).resolve().parents[2]

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
