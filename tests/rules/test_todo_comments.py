"""
A `# TODO:` comment left in a rules file (what `receipts rules draft` could not decide) is a warning
(proxy_addon/rules/todo_comments.py): `receipts rules check` prints each one with its file and line, its
`#   ` continuation lines joined, and still passes (a comment changes no rule). A `# TODO:` line inside a
multi-line string is text, not a comment. The shipped packs hold none.
"""

from __future__ import annotations

from pathlib import Path

from proxy_addon.cli import main
from proxy_addon.rules.todo_comments import todo_comments, todo_summary, todos_in

ROOT = Path(__file__).resolve().parents[2]

RULES = """\
# TODO: the file's own: check the host
api: team
hosts: [team.test]
operations:
  posts.create:
    # TODO: name the fields that make a write,
    #   two lines of it
    # a plain comment
    match: {method: POST, path: /posts}
    description: |
      # TODO: this is text in a string, no comment
    fingerprint: {body: [title]}  # TODO: a trailing comment is not one of ours
"""


def test_each_todo_comment_is_named_with_its_line_and_its_continuation():
    assert todos_in(RULES) == [
        (1, "the file's own: check the host"),
        (6, "name the fields that make a write, two lines of it"),
    ]


def test_rules_check_warns_of_each_todo_and_passes(tmp_path, capsys):
    path = tmp_path / "team.yaml"
    path.write_text(RULES)
    assert main(["rules", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert f"ok  {path}: 1 operations" in out
    assert f"warning: {path}:1: TODO: the file's own: check the host" in err
    assert f"warning: {path}:6: TODO: name the fields that make a write, two lines of it" in err
    assert "text in a string" not in err
    assert todo_summary(path) == [
        f"{path}: 2 TODO comments left: its rules are a draft where they stand (`receipts rules check {path}` "
        "lists them)"
    ]


def test_a_file_without_todos_has_no_warning(tmp_path):
    path = tmp_path / "team.yaml"
    path.write_text(RULES.replace("TODO", "NOTE"))
    assert todo_comments(path) == []
    assert todo_summary(path) == []


def test_the_shipped_packs_have_no_todo():
    assert todo_comments(ROOT / "rules") == []
