"""The figures README.md and docs/*.md quote from results, and whether each is backed: tests/test_claims.py.

A claim is a sentence, or a table row, that links a results file (experiments/results/...) or a page
of measurements (docs/results.md, docs/benchmarks.md). A table row that links none of these takes the
links of the paragraph that introduces its table (the settings table under "From the measurements in
[results](...)"), and that paragraph's stale markers with them. Its figures are the numbers with a
decimal point and the ratios (`0.48x`, `3x`, `6.6%`); integers (ranks, peers, seeds, steps, targets
such as 60%) are setup and not checked, nor is anything in `code`, a link's target, or a number after
"goal". Each figure must

- appear in a file the claim links, as a number (`0.3` does not match `0.35`, `25.0` not `25`), or be
  the ratio of the two numbers quoted right after it that are in that file ("0.30x (25 s vs 83.8 s)",
  "0.56x (incast-8: 19.3 s against 34.4 s)"); in a
  page of measurements, in one of its own claims, which must in turn be backed by a results file;
- come from a results file whose `Measured:` commit is no older than the last change to the code it
  measures (experiments/registry.py), or the claim says it is from an older version with the marker

      (measured at abc1234, before <the change>)   or   (measured at or before abc1234 and def5678, before ...)

  naming that file's commit (the commits of all its files, for a claim that quotes several). A marker on a claim whose files are all fresh is an error too: re-measured
  claims drop their marker.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = "experiments/results"
PAGES = ("docs/results.md", "docs/benchmarks.md")  # pages of measurements: their claims cite results files

LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
CODE = re.compile(r"`[^`]*`")
HASH = r"[0-9a-f]{7,40}"
MARKER = re.compile(rf"measured at (?:or before )?(?P<commits>{HASH}(?:(?:,| and) {HASH})*),? before (?P<change>[^);]+)")
RATIO = re.compile(r"(\d+(?:\.\d+)?)(?:\s*[A-Za-z/]+)?\s+(?:vs|against)\s+(\d+(?:\.\d+)?)")
FIGURE = re.compile(r"(?<![\w.])(?P<goal>goals? )?(?P<num>\d+\.\d+|\d+(?=x\b))(?P<unit>x\b|%)?")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*(\[])|(?<=[;:])\s+(?=[A-Z])")


@dataclass
class Claim:
    """One sentence or table row that cites results: where it is, its figures, what it links."""

    doc: str                 # repository-relative path of the file it is in
    line: int                # its first line there (1-based)
    text: str                # the text as written
    links: list[str] = field(default_factory=list)    # cited files, repository-relative
    figures: list[str] = field(default_factory=list)  # the numbers it quotes, as written
    markers: list[str] = field(default_factory=list)  # the commits its stale markers name


def _prose(text: str) -> str:
    """`text` without code spans, link targets, stale markers and bold."""
    return MARKER.sub(" ", LINK.sub(lambda m: m[2], CODE.sub(" ", text))).replace("**", "")


def figures_of(text: str) -> list[str]:
    """The figures of `text`: its numbers with a decimal point and its ratios, outside code spans,
    link targets and stale markers, not after "goal"."""
    return [m["num"] for m in FIGURE.finditer(_prose(text)) if not m["goal"]]


def ratio_pairs(figure: str, text: str) -> list[tuple[str, str]]:
    """The (a, b) that `text` quotes right after `figure` as its ratio: '0.30x (25 s vs 83.8 s)' gives
    ('25', '83.8') (the parenthesis that follows the figure, its first "a [unit] vs|against b")."""
    pairs = []
    for m in re.finditer(rf"(?<![\d.]){re.escape(figure)}x?\s*\(([^()]*)\)", _prose(text)):
        quoted = RATIO.search(m[1])
        if quoted:
            pairs.append((quoted[1], quoted[2]))
    return pairs


def is_ratio(figure: str, pairs: list[tuple[str, str]], text: str) -> bool:
    """Whether `figure` is a / b, to its own decimals, for one of `pairs` whose numbers are both in `text`."""
    decimals = len(figure.partition(".")[2])
    return any(float(b) and f"{float(a) / float(b):.{decimals}f}" == figure and appears(a, text) and appears(b, text)
               for a, b in pairs)


def appears(figure: str, text: str) -> bool:
    """Whether `figure` is a number of `text` (not a part of a longer one)."""
    return re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])(?!\.\d)", text) is not None


def _cited(doc: str, target: str) -> str | None:
    """The repository-relative file a link in `doc` cites (a results file or a page of measurements),
    or None for any other link (guides, images, anchors)."""
    path = target.split("#")[0]
    if not path or "://" in path:
        return None
    resolved = (ROOT / doc).parent.joinpath(path).resolve()
    try:
        rel = str(resolved.relative_to(ROOT))
    except ValueError:
        return None
    if rel in PAGES or (rel.startswith(RESULTS_DIR + "/") and rel.endswith((".md", ".csv"))):
        return rel
    return None


def _blocks(lines: list[str]) -> Iterator[tuple[str, int, list[str]]]:
    """('table' | 'text', first line number, lines) for each block of a Markdown file, without code
    fences, headings and image-only lines; a list item starts a block of its own."""
    kind, start, block, fenced = "", 0, [], False
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        new_item = re.match(r"([-*]|\d+\.) ", stripped) is not None
        this = "table" if stripped.startswith("|") else "text"
        skip = fenced or stripped.startswith(("```", "#")) or re.fullmatch(r"!\[[^\]]*\]\([^)]*\)", stripped)
        if block and (not stripped or skip or this != kind or (new_item and kind == "text")):
            yield kind, start, block
            block = []
        if stripped and not skip:
            if not block:
                kind, start = this, number
            block.append(stripped)
    if block:
        yield kind, start, block


def parse(doc: str, text: str) -> list[Claim]:
    """The claims of Markdown `text`, the file `doc` (repository-relative)."""
    claims: list[Claim] = []
    intro: Claim | None = None  # the paragraph before a table: links and markers for rows without
    for kind, start, block in _blocks(text.splitlines()):
        if kind == "table":
            rows = [(start + i, row) for i, row in enumerate(block) if not re.fullmatch(r"\|[-:| ]+\|?", row)]
            for number, row in rows[1:]:  # rows[0] is the header
                claim = _claim(doc, number, row)
                if not claim.links and intro is not None:
                    claim.links, claim.markers = list(intro.links), list(intro.markers)
                if claim.links and claim.figures:
                    claims.append(claim)
            continue
        paragraph = _claim(doc, start, " ".join(block))
        intro = paragraph if paragraph.links else None
        for sentence in SENTENCE_END.split(paragraph.text):
            claim = _claim(doc, start + _line_of(block, sentence), sentence)
            if claim.links and claim.figures:
                claims.append(claim)
    return claims


def _claim(doc: str, line: int, text: str) -> Claim:
    links = [c for m in LINK.finditer(text) if not m[1] and (c := _cited(doc, m[3]))]
    return Claim(doc, line, text, list(dict.fromkeys(links)), figures_of(text),
                 [c for m in MARKER.finditer(text) for c in re.findall(HASH, m["commits"])])


def _line_of(block: list[str], sentence: str) -> int:
    """The offset in `block` of the line where `sentence` starts."""
    head = sentence[:30]
    return next((i for i, line in enumerate(block) if head in line), 0)


@dataclass
class Source:
    """A results file behind a figure: its path, its `Measured:` commit ('' when it has no line) and
    whether its measured code changed since."""

    path: str
    commit: str
    stale: bool


def check(claims: list[Claim], read: Callable[[str], str], source: Callable[[str], Source],
          page_claims: Callable[[str], list[Claim]]) -> list[str]:
    """The problems of `claims`, one line each ('README.md:12: 0.30 not in ...'); [] when all hold.
    `read(path)` is a cited file's text, `source(path)` the results file behind a cited path,
    `page_claims(page)` the claims of a page of measurements."""
    problems = []
    for claim in claims:
        where = f"{claim.doc}:{claim.line}"
        needs_marker: set[str] = set()  # commits of stale sources some figure depends on
        fresh_figures = 0
        for figure in claim.figures:
            sources, missing = _backing(figure, claim.links, read, source, page_claims,
                                        ratio_pairs(figure, claim.text))
            if not sources:
                problems.append(f"{where}: {figure} is not in {missing or ' or '.join(claim.links)}")
                continue
            if any(not s.stale for s in sources):
                fresh_figures += 1
                continue
            if not any(same_commit(s.commit, m) for s in sources for m in claim.markers):
                commits = ", ".join(sorted({f"{s.path} at {s.commit or '?'}" for s in sources}))
                problems.append(f"{where}: {figure} comes from older code ({commits}): re-measure, or mark the "
                                f"claim '(measured at <commit>, before <the change>)'")
            needs_marker.update(s.commit for s in sources)
        for marker in claim.markers:
            if not any(same_commit(c, marker) for c in needs_marker):
                problems.append(f"{where}: the marker 'measured at {marker}' names no stale file this claim "
                                f"quotes{' (they are all fresh: drop it)' if fresh_figures else ''}")
    return problems


def same_commit(commit: str, named: str) -> bool:
    """Whether abbreviations `commit` and `named` can name the same commit (one a prefix of the other)."""
    return bool(commit and named) and (commit.startswith(named) or named.startswith(commit))


def _backing(figure: str, links: list[str], read: Callable[[str], str], source: Callable[[str], Source],
             page_claims: Callable[[str], list[Claim]], pairs: list[tuple[str, str]],
             seen: frozenset[str] = frozenset()) -> tuple[list[Source], str]:
    """The results files that back `figure` among `links` (through a page's own claims, each page
    once; in a results file also as the ratio a / b of one of `pairs`), and, when there is
    none, why ('': it is in no linked file)."""
    sources: list[Source] = []
    unbacked = []
    for link in links:
        text = read(link) if link not in seen else ""
        if not (appears(figure, text) or (link not in PAGES and is_ratio(figure, pairs, text))):
            continue
        if link not in PAGES:
            sources.append(source(link))
            continue
        inner = [c for c in page_claims(link) if figure in c.figures]
        backed = [s for c in inner for s in _backing(figure, c.links, read, source, page_claims,
                                                       ratio_pairs(figure, c.text), seen | {link})[0]]
        sources += backed
        if not backed:
            unbacked.append(f"a results file ({link} quotes it, citing none that has it)")
    return sources, ", ".join(unbacked)
