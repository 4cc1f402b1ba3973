"""
No function over 60 lines: python scripts/long_functions.py [PATH ...] (default: proxy_addon).

The rule: a function's length is the number of lines from its `def` line to its last line, both
included, as an editor numbers them. Everything in between counts: the docstring, comments, blank
lines and nested functions (a nested function is also measured on its own). Decorators, above the
`def`, do not. Methods and `async def` are functions too; lambdas are not measured.

Why the docstring counts: it is part of what a reader must take in to know the function, and a
function that needs a long one to be understood usually does more than one thing. A table that is
data (DDL, metric or option declarations) is better written as a data structure than as a long
function. Prints each function over the limit as `path:line: name is N lines (at most 60)` and
exits 1 if there is one; scripts/check runs it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

LIMIT = 60


def lengths(source: str) -> Iterator[tuple[int, str, int]]:
    """(line, qualified name, length in lines) of every function in a module's source."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[int, str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                yield child.lineno, name, child.end_lineno - child.lineno + 1
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(source), "")


def too_long(paths: list[Path], limit: int = LIMIT) -> list[str]:
    found = []
    for root in paths:
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            for line, name, length in lengths(path.read_text()):
                if length > limit:
                    found.append(f"{path}:{line}: {name} is {length} lines (at most {limit})")
    return found


def main(argv: list[str]) -> int:
    found = too_long([Path(a) for a in argv] or [Path("proxy_addon")])
    for problem in found:
        print(problem)
    if found:
        print(
            f"{len(found)} function{'s' if len(found) != 1 else ''} over {LIMIT} lines: split each into "
            "well-named parts (the rule: scripts/long_functions.py)"
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
