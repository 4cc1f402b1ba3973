"""
Rules files are data, not programs: an alias bomb is refused by `rules check` with its line, and a file
past the size bound is refused by the loader. A reload off the event loop, and one that fails, through
real processes: tests/e2e/proxy/test_rules_reload.py.
"""

from __future__ import annotations

import shutil

from proxy_addon.cli import main
from proxy_addon.rules import check_rules_path
from proxy_addon.rules.loader import MAX_RULES_BYTES
from tests.conftest import ROOT

BOMB = ROOT / "tests" / "rules_bad" / "94-alias-bomb.yaml"


def test_rules_check_refuses_an_alias_bomb_with_its_line(tmp_path, capsys):
    shutil.copy(BOMB, tmp_path / "bomb.yaml")
    assert main(["rules", "check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'bomb.yaml'}:14: YAML aliases (*a) are not allowed in rules files" in err


def test_a_rules_file_past_the_size_bound_is_refused(tmp_path):
    f = tmp_path / "huge.yaml"
    f.write_text("# padding\n" * (MAX_RULES_BYTES // 10 + 1) + "api: x\n")
    _, problems = check_rules_path(tmp_path)
    assert [str(p) for p in problems] == [
        f"{f}: the file is {f.stat().st_size} bytes; a rules file is at most {MAX_RULES_BYTES}"
    ]
