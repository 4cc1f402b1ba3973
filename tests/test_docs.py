"""
The docs hold together: README.md stays short, every relative link and anchor in README.md and docs/*.md
leads somewhere, and every section that the code's messages and the docs name in words ("docs/operations.md:
'Starting over'") exists. The generated pages are checked where they are generated: docs/options.md in
tests/mitm/test_options_reference.py, docs/cli.md in tests/cli/test_reference.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings (outside code blocks), GitHub's way: a repeated one gets -1, -2."""
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        m = re.match(r"#{1,6} (.+)", line)
        if m and not in_fence:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def headings(page: Path) -> list[str]:
    return [m.group(1).replace("`", "") for m in re.finditer(r"^#{1,6} (.+)$", page.read_text(), re.M)]


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link and image on the page, outside code blocks and code spans."""
    out = []
    in_fence = False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        out += [(n, m.group(1)) for m in re.finditer(r"\]\(([^)\s]+)\)", line)]
    return out


def test_the_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; it is for a newcomer: move the rest to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_leads_somewhere(page):
    broken = []
    for line, target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, file:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.name}:{line}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{page.name}:{line}: {target}: no heading with that anchor in {dest.name}")
    assert not broken, "\n".join(broken)


# A section named in words: README: 'Starting over', docs/rules.md, "Credentials" (a heading starting so).
NAMED = re.compile(r"""(README(?:\.md)?|docs/[\w./-]+\.md)[,:] ["'](?P<heading>[^"'\n]+)["']""")


def named_sections() -> list[tuple[str, str, str]]:
    """(where, page, heading) for every section the package, the scripts and the docs name in words."""
    sources = [
        *(ROOT / "proxy_addon").rglob("*.py"),
        *(ROOT / "scripts").iterdir(),
        *PAGES,
        ROOT / "docs" / "receipt-proxy.service",
        ROOT / "docs" / "fleet" / "haproxy.cfg",
    ]
    found = []
    for source in sources:
        if not source.is_file():
            continue
        for m in NAMED.finditer(source.read_text()):
            found.append((str(source.relative_to(ROOT)), m.group(1), m.group("heading")))
    return found


def test_the_sections_named_in_words_exist():
    found = named_sections()
    assert any(where.startswith("proxy_addon/") for where, _, _ in found)  # the check is not vacuous
    missing = [
        f"{where} names {page}: {heading!r}"
        for where, page, heading in found
        if not any(h.startswith(heading) for h in headings(ROOT / ("README.md" if page.startswith("README") else page)))
    ]
    assert not missing, "\n".join(missing)


def test_the_checks_see_what_they_must(tmp_path):
    """The slug and link checks find a broken anchor and a missing file; the README check counts lines."""
    (tmp_path / "a.md").write_text(
        "# Top\n## Run it: `now` (fast)\n```sh\n# not a heading\n```\n"
        "[ok](#run-it-now-fast) [bad](#not-a-heading) [gone](b.md) `[code](c.md)`\n"
    )
    assert anchors(tmp_path / "a.md") == {"top", "run-it-now-fast"}
    assert [t for _, t in links(tmp_path / "a.md")] == ["#run-it-now-fast", "#not-a-heading", "b.md"]
    named = NAMED.search("refused (docs/operations.md: 'Starting over')")
    assert named is not None and named.group("heading") == "Starting over"


def test_the_architecture_names_every_module():
    """docs/architecture.md has a line for every module of the package, under its folder's heading."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    parts = re.split(r"^`(\w+)/`: ", text, flags=re.M)  # "`wire/`: what a request ..." starts a folder's list
    listed = {folder: body for folder, body in zip(parts[1::2], parts[2::2], strict=True)}
    package = ROOT / "proxy_addon"
    missing = []
    for module in sorted(package.rglob("*.py")):
        folder = module.parent.relative_to(package).as_posix()
        if module.name == "__init__.py" and folder != ".":
            continue
        body = listed.get(folder, parts[0]) if folder != "." else parts[0]
        if f"`{module.name}`" not in body:
            missing.append(str(module.relative_to(ROOT)))
    assert not missing, f"docs/architecture.md does not name: {missing}"
