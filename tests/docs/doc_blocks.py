"""The fenced code blocks of README.md and docs/*.md, for the tests that run them (tests/docs/test_readme.py,
tests/frontends/test_notebook.py)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def documents() -> list[Path]:
    """README.md and the pages of docs/ (docs/proofs/ holds arguments, not examples)."""
    pages = sorted(DOCS.glob("*.md")) if DOCS.is_dir() else []
    return [p for p in [README, *pages] if p.is_file()]


def blocks_of(path: Path) -> list[tuple[str, int, str]]:
    """(language, line number, text) of each fenced block of ``path``; an indented fence (in a list item)
    is dedented by its own indentation."""
    out: list[tuple[str, int, str]] = []
    current: list[str] | None = None
    start, kind, indent = 0, "", 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("```"):
            if current is None:
                current, start, kind, indent = [], number, stripped[3:].strip(), len(line) - len(stripped)
            else:
                out.append((kind, start, "\n".join(current) + "\n"))
                current = None
        elif current is not None:
            current.append(line[indent:] if line[:indent].strip() == "" else line)
    return out


def label(path: Path) -> str:
    """``path`` as the tests name it: relative to the checkout."""
    return str(path.relative_to(ROOT))
