"""
`# TODO:` comments left in a rules file: what `receipts rules draft` could not decide, for the
user to settle. A file that still has some loads (a comment changes nothing), but its rules are
a guess where a TODO stands: `receipts rules check` prints each one as a warning, with its file
and line, and the proxy logs how many each file has whenever it loads the rules.

A TODO is a comment line that starts `# TODO:` (after any indentation), with the `#   ` lines
right below it as its continuation. Such a line inside a multi-line string (a `|` block) is text,
not a comment, and is not counted.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from proxy_addon.rules.loader import rules_files

TODO = re.compile(r"^\s*#\s*TODO:\s*(.*)$")
_GOES_ON = re.compile(r"^\s*#\s{2,}(\S.*)$")  # `#   more words`: the comment above goes on


def todo_comments(path: str | Path) -> list[str]:
    """`file:line: TODO: text` for each TODO comment in a rules file or folder."""
    found = []
    for file in rules_files(path):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # the loader reports the file itself
        if "TODO" not in text:
            continue
        found += [f"{file}:{line}: TODO: {what}" for line, what in todos_in(text)]
    return found


def todos_in(text: str) -> list[tuple[int, str]]:
    """(line, text) of each TODO comment of a rules file's text, its continuation lines joined."""
    lines = text.splitlines()
    inside = _string_lines(text)
    out: list[tuple[int, str]] = []
    n = 0
    while n < len(lines):
        m = TODO.match(lines[n])
        if m is None or n + 1 in inside:
            n += 1
            continue
        words = [m.group(1).strip()]
        start = n + 1
        n += 1
        while n < len(lines) and (more := _GOES_ON.match(lines[n])) and n + 1 not in inside:
            words.append(more.group(1).strip())
            n += 1
        out.append((start, " ".join(w for w in words if w)))
    return out


def _string_lines(text: str) -> set[int]:
    """The lines (1-based) inside a scalar that spans lines (a `|` or `>` block, a quoted string)."""
    inside: set[int] = set()
    try:
        events = list(yaml.parse(text))
    except yaml.YAMLError:
        return inside  # the loader reports it; every `# TODO:` line is taken as a comment
    for event in events:
        if isinstance(event, yaml.ScalarEvent) and event.start_mark and event.end_mark:
            first, last = event.start_mark.line + 1, event.end_mark.line + 1
            if last > first:
                inside.update(range(first + 1, last + 1))
    return inside


def todo_summary(path: str | Path) -> list[str]:
    """One line per rules file that has TODO comments, for the proxy's log."""
    counts: dict[str, int] = {}
    for warning in todo_comments(path):
        file = warning.split(":", 1)[0]
        counts[file] = counts.get(file, 0) + 1
    return [
        f"{file}: {n} TODO comment{'s' if n != 1 else ''} left: its rules are a draft where they stand "
        f"(`receipts rules check {file}` lists them)"
        for file, n in counts.items()
    ]
