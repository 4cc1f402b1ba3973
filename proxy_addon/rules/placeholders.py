"""
Placeholders left in a rules file: a value such as `YOUR-BOT-LOGIN` that the user was meant to
replace before use. A rule that still holds one loads (it is valid YAML and a valid rule), but it
does not do what it says: a read filtered by `creator=YOUR-BOT-LOGIN` finds nothing, ever.

`placeholders(path)` names each one, with its file and line. `receipts rules check` prints them as
warnings, and the proxy logs them as WARNINGs each time it loads the rules. Comments are not read:
a comment may well say what to put in place of a value.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from proxy_addon.rules.loader import rules_files

PLACEHOLDER = re.compile(r"\bYOUR[-_][A-Z0-9][A-Z0-9_-]*")


def placeholders(path: str | Path) -> list[str]:
    """`file:line: placeholder YOUR-… left in a value: …` for each one in a rules file or folder."""
    found = []
    for file in rules_files(path):
        try:
            text = file.read_text(encoding="utf-8")
            if not PLACEHOLDER.search(text):  # the common case, without parsing the file again
                continue
            events = list(yaml.parse(text))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # the loader reports the file itself
        for event in events:
            if isinstance(event, yaml.ScalarEvent):
                for name in dict.fromkeys(PLACEHOLDER.findall(event.value)):
                    line = event.start_mark.line + 1 if event.start_mark else "?"
                    found.append(
                        f"{file}:{line}: placeholder {name} left in a value: replace it with your own before use "
                        "(until then the rule does not do what it says)"
                    )
    return found
