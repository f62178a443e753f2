"""The examples of README.md and docs/*.md, found and classified for tests/test_examples.py.

An example is a fenced block in `sh`, `console` (`$ ` prompts), `python` or `c`. The line right
before its fence may say how it runs, in an HTML comment a reader of the rendered page does not see:

    <!-- example: long -->                 runs in `make test-long` only (minutes, or a screen)
    <!-- example: not run: REASON -->      cannot run on one machine; listed with REASON
    <!-- example: continues -->            python: runs after the previous python example of
                                           the same document, in the same interpreter
    <!-- example: in the source tree -->   sh: runs in the repository (make), not the workspace

Without a comment the example runs in the default suite. Options combine with commas
(`<!-- example: long, in the source tree -->`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANGUAGES = {"sh", "console", "python", "c"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"<!--\s*example:\s*(.*?)\s*-->\s*$")
OPTIONS = {"long", "continues", "in the source tree"}


@dataclass
class Example:
    """One example (a python example with its continuations appended)."""

    doc: str
    line: int
    lang: str
    code: str
    long: bool = False
    not_run: str | None = None
    in_source_tree: bool = False
    parts: list[int] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


class MarkerError(ValueError):
    pass


def _options(doc: str, line: int, text: str) -> tuple[set[str], str | None]:
    if text.startswith("not run:"):
        reason = text.removeprefix("not run:").strip()
        if not reason:
            raise MarkerError(f"{doc}:{line}: 'not run' needs a reason")
        return set(), reason
    options = {o.strip() for o in text.split(",")}
    unknown = options - OPTIONS
    if unknown:
        raise MarkerError(f"{doc}:{line}: unknown example option(s) {sorted(unknown)}")
    return options, None


def _code(lang: str, body: str) -> str:
    if lang != "console":
        return body
    # `$ command  # comment` lines are the commands; anything else is shown output.
    return "".join(line[2:] + "\n" for line in body.splitlines() if line.startswith("$ "))


def examples(doc: Path) -> list[Example]:
    """The examples of one document, in order, continuations merged into their head."""
    text = doc.read_text(encoding="utf-8")
    name = str(doc.relative_to(ROOT))
    found: list[Example] = []
    for m in FENCE.finditer(text):
        lang = m.group(1)
        if lang not in LANGUAGES:
            continue
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        options, reason = _options(name, line, marker.group(1)) if marker else (set(), None)
        code = _code(lang, m.group(2))
        if "continues" in options:
            heads = [e for e in found if e.lang == "python"]
            if lang != "python" or not heads:
                raise MarkerError(f"{name}:{line}: 'continues' needs an earlier python example")
            heads[-1].code += "\n" + code
            heads[-1].parts.append(line)
            continue
        found.append(
            Example(
                name,
                line,
                "sh" if lang == "console" else lang,
                code,
                long="long" in options,
                not_run=reason,
                in_source_tree="in the source tree" in options,
                parts=[line],
            )
        )
    return found


def all_examples() -> list[Example]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [e for doc in docs for e in examples(doc)]
