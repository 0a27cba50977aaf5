"""Documentation stays navigable and self-contained: every relative Markdown link in README.md, docs/ and the
studies' READMEs resolves (a file or folder inside the repository, and a `#anchor` to a heading of the target),
every docs page is listed in docs/index.md, README.md stays short, and no tracked file cites a document that lives
outside the repository. External http(s) links are not fetched."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced and indented code blocks."""
    out: list[tuple[int, str]] = []
    fenced = False
    prev_blank = True
    indented = False
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            prev_blank = False
            continue
        if fenced:
            continue
        blank = not line.strip()
        # An indented code block starts after a blank line with 4+ spaces (or a tab) and runs until a
        # non-blank line with less indentation.
        if line.startswith(("    ", "\t")) and (indented or prev_blank):
            indented = True
        elif not blank:
            indented = False
        prev_blank = blank
        if indented or blank:
            continue
        out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.add(base if k == 0 else f"{base}-{k}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every inline link, image and reference definition in prose."""
    found: list[tuple[int, str]] = []
    for n, raw in _prose_lines(path.read_text(encoding="utf-8")):
        line = _INLINE_CODE.sub(lambda m: " " * len(m.group(0)), raw)  # `[x](y)` in code is not a link
        found.extend((n, m.group(1)) for m in _LINK.finditer(line))
        m = _REF_DEF.match(line)
        if m:
            found.append((n, m.group(1)))
    return found


def broken_links(path: Path, root: Path) -> list[str]:
    """Problems with the relative links of one Markdown file under `root`, as `file:line: target: why`."""
    problems = []
    where = path.relative_to(root)
    for n, target in links(path):
        if not target or _EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        if file_part.startswith("/"):
            problems.append(f"{where}:{n}: {target}: use a link relative to the file, not to the site root")
            continue
        dest = (path.parent / file_part).resolve() if file_part else path
        try:
            dest.relative_to(root)
        except ValueError:
            problems.append(f"{where}:{n}: {target}: points outside the repository")
            continue
        if not dest.exists():
            problems.append(f"{where}:{n}: {target}: no such file or folder")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}:{n}: {target}: no heading #{anchor} in {dest.relative_to(root)}")
    return problems


def doc_files(root: Path) -> list[Path]:
    files = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    files += sorted(root.glob("studies/**/README.md"))
    return [f for f in files if f.is_file()]


DOCS = doc_files(ROOT)


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_relative_links_resolve(path: Path) -> None:
    assert broken_links(path, ROOT) == []


def test_the_docs_exist() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    for page in ("README.md", "docs/index.md", "docs/markov.md", "docs/cli.md", "docs/config.md"):
        assert page in names


def test_every_docs_page_is_listed_in_the_index() -> None:
    index = ROOT / "docs" / "index.md"
    listed = {(index.parent / t.partition("#")[0]).resolve() for _, t in links(index) if not _EXTERNAL.match(t)}
    missing = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "docs").rglob("*.md"))
               if p != index and p.resolve() not in listed]  # fmt: skip
    assert missing == [], "add a line for each page to docs/index.md"


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_readme_keeps_the_lines_ci_runs() -> None:
    """`.ci/quickstart` takes the quick-start command from README.md by this pattern and runs it; `.ci/run` runs the
    test command the README gives."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    pattern = re.search(r"grep -m1 -E '([^']+)' README.md", (ROOT / ".ci" / "quickstart").read_text()).group(1)
    quick = [ln for ln in text.splitlines() if re.search(pattern, ln)]
    assert quick and quick[0].strip() == (
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && trsim run --hop-rate 0.1"
    )
    assert '    pip install "torch==2.13.0" -e ".[engine,dev]" && python -m pytest' in text.splitlines()


# Citations of documents that were never part of the repository (a design brief and GPU notes kept beside it).
_OUTSIDE = ("../" + "shared", "DESIGN" + " section", "GPU" + "_NOTES")


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [f for f in out.decode().split("\0") if f]


def test_no_file_cites_documents_outside_the_repository() -> None:
    hits = []
    for rel in _tracked():
        if "docs-history" in Path(rel).parts:
            continue
        path = ROOT / rel
        if not path.is_file():
            continue
        data = path.read_bytes()
        hits += [f"{rel}: {s}" for s in _OUTSIDE if s.encode() in data]
    assert hits == []


# -- the checker itself: it must find what it is meant to find ----------------------------------------------


def test_checker_flags_broken_files_and_anchors(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Page A\n\n## The cost model\n\n## Usage\n\n## Usage\n")
    (tmp_path / "README.md").write_text(
        "# Top\n\n"
        "[ok](docs/a.md) [ok](docs/a.md#the-cost-model) [ok](docs/a.md#usage-1) [ok](#top) [ok](docs/)\n"
        "[ext](https://example.com/nothing) ![img](docs/a.md)\n"
        "[gone](docs/b.md) [bad anchor](docs/a.md#nothing) [outside](../x.md) [root](/docs/a.md)\n"
        "`[code](docs/c.md)` and\n\n    [indented code](docs/d.md)\n\n"
        "```\n[fenced](docs/e.md)\n```\n"
        "[ref]: docs/f.md\n"
    )
    got = broken_links(tmp_path / "README.md", tmp_path)
    assert [g.split(": ")[1] for g in got] == ["docs/b.md", "docs/a.md#nothing", "../x.md", "/docs/a.md", "docs/f.md"]


def test_slug_follows_github() -> None:
    assert slug("`trsim tune`") == "trsim-tune"
    assert slug("Front-end (OpenAI API)") == "front-end-openai-api"
    assert slug("Choosing B: `trsim tune`") == "choosing-b-trsim-tune"
    assert slug("Co-location: a shared GPU as processor sharing") == "co-location-a-shared-gpu-as-processor-sharing"
    assert slug("Results on one H200 (2026-11-29/30)") == "results-on-one-h200-2026-11-2930"
