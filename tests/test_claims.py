"""Every figure README.md and docs/*.md quote from a result is in the file they link, measured on
today's code or marked as older (experiments/claims.py says how); the parser itself on a fake README;
every results file named in experiments/registry.py with its Measured: line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import claims  # noqa: E402
import provenance  # noqa: E402
import stale  # noqa: E402
from registry import RESULTS as REGISTRY  # noqa: E402

FRESH, OLD, OTHER = "aaaaaaa1", "bbbbbbb2", "ccccccc3"


def check_fake(doc: str, files: dict[str, str], stale_files: set[str] = frozenset()) -> list[str]:
    """claims.check on the fake README `doc` whose cited files are `files` (path -> text); the results
    files in `stale_files` measured at OLD (RESULT) or OTHER, the others at FRESH."""
    def source(path: str) -> claims.Source:
        stale_at = OLD if path == RESULT else OTHER
        return claims.Source(path, stale_at if path in stale_files else FRESH, path in stale_files)

    return claims.check(claims.parse("README.md", doc), files.__getitem__, source,
                        lambda page: claims.parse(page, files[page]))


RESULT = "experiments/results/tta.md"
TTA = "# tta\n\n| net | ratio |\n|---|---|\n| lossy-4 | 0.48 |\n| heterogeneous-4 | 0.30 |\n| homogeneous-8 | 1.28 |\n"


def test_parser_accepts_figures_that_are_in_the_linked_file() -> None:
    doc = "It reached 60% in **0.30x** the time and 0.48x under 1% loss ([table](experiments/results/tta.md)).\n"
    assert check_fake(doc, {RESULT: TTA}) == []


def test_parser_refuses_a_wrong_number_a_rounded_one_and_a_range_end() -> None:
    doc = ("Under loss 0.47x ([table](experiments/results/tta.md)). Uneven links 0.3x ([table](experiments/results/tta.md)).\n\n"
           "- A range 0.30-1.05x ([table](experiments/results/tta.md)).\n")
    problems = check_fake(doc, {RESULT: TTA})
    assert [p.split(": ")[1].split(" ")[0] for p in problems] == ["0.47", "0.3", "1.05"], problems
    assert problems[0].startswith("README.md:1: ") and problems[2].startswith("README.md:3: ")


def test_parser_skips_setup_integers_code_goals_and_unlinked_sentences() -> None:
    doc = ("With `--loss-bound 0.05` on 4 ranks, 3 seeds: 0.48x (goal 0.25x) ([table](experiments/results/tta.md)).\n"
           "This sentence cites nothing: 9.99x.\n")
    claim, = claims.parse("README.md", doc)
    assert claim.figures == ["0.48"]
    assert check_fake(doc, {RESULT: TTA}) == []


def test_a_ratio_may_be_of_two_figures_the_claim_quotes_from_the_file() -> None:
    files = {RESULT: "| heterogeneous-4 p2plearn | 25 s |\n| heterogeneous-4 local SGD | 83.8 s |\n"}
    assert check_fake("Uneven links: 0.30x (25 s vs 83.8 s) ([table](experiments/results/tta.md)).\n", files) == []
    problems = check_fake("Uneven links: 0.31x (25 s vs 83.8 s) ([table](experiments/results/tta.md)).\n", files)
    assert len(problems) == 1 and "0.31 is not in" in problems[0], problems
    problems = check_fake("25 s against 83.8 s: 0.30x ([table](experiments/results/tta.md)).\n", files)
    assert len(problems) == 1 and "0.30 is not in" in problems[0], problems  # only the parenthesis after it
    problems = check_fake("Uneven links: 0.30x (25 s vs 83.8 s) ([table](experiments/results/tta.md)).\n",
                          {RESULT: "| heterogeneous-4 p2plearn | 25 s |\n"})
    assert any("0.30 is not in" in p for p in problems), problems  # 25 and 83.8 must be in the file too


def test_a_table_row_without_links_takes_its_intro_paragraphs() -> None:
    doc = ("From the measurements in [results](experiments/results/tta.md):\n\n"
           "| network | measured |\n|---|---|\n| uneven | 0.30x |\n| clean, 8 peers | 1.82x |\n")
    problems = check_fake(doc, {RESULT: TTA})
    assert len(problems) == 1 and "README.md:6: 1.82 is not in experiments/results/tta.md" in problems[0], problems


def test_a_stale_file_needs_a_marker_naming_its_commit() -> None:
    files = {RESULT: TTA}
    plain = "Under loss 0.48x ([table](experiments/results/tta.md)).\n"
    assert "comes from older code" in check_fake(plain, files, {RESULT})[0]
    marked = f"Under loss 0.48x ([table](experiments/results/tta.md); measured at {OLD[:7]}, before wire v3).\n"
    assert check_fake(marked, files, {RESULT}) == []
    wrong = f"Under loss 0.48x ([table](experiments/results/tta.md); measured at {FRESH[:7]}, before wire v3).\n"
    problems = check_fake(wrong, files, {RESULT})
    assert len(problems) == 2 and "older code" in problems[0] and "names no stale file" in problems[1], problems
    assert "drop it" in check_fake(marked, files)[0]  # re-measured: the marker must go
    two = {RESULT: TTA, "experiments/results/b.md": "| x | 1.5 |\n"}
    both = ("0.48x and 1.5x ([a](experiments/results/tta.md), [b](experiments/results/b.md); measured at or before "
            "{} and {}, before wire v3).\n")
    assert check_fake(both.format(OLD[:7], OTHER[:7]), two, set(two)) == []  # a marker may name several commits
    problems = check_fake(both.format(OLD[:7], FRESH[:7]), two, set(two))
    assert len(problems) == 2 and "1.5 comes from older code" in problems[0], problems
    assert f"'measured at {FRESH[:7]}' names no stale file" in problems[1], problems



def test_a_page_of_measurements_must_itself_be_backed() -> None:
    page = ("# Results\n\n| claim | result |\n|---|---|\n"
            "| [tta](../experiments/results/tta.md) | 0.48x under loss |\n"
            "| incast | 0.06x |\n")
    files = {RESULT: TTA, "docs/results.md": page}
    assert check_fake("Under loss 0.48x ([results](docs/results.md)).\n", files) == []
    problems = check_fake("Under incast 0.06x ([results](docs/results.md)).\n", files)
    assert len(problems) == 1 and "0.06 is not in a results file" in problems[0], problems
    assert "older code" in check_fake("Under loss 0.48x ([results](docs/results.md)).\n", files, {RESULT})[0]


def test_the_measured_line_round_trips(tmp_path: Path) -> None:
    line = provenance.Provenance("c5ca31e", False, "tree unknown", "unknown", "0, 1, 2",
                                 "sudo python experiments/x.py --rows change").line()
    path = tmp_path / "x.md"
    path.write_text("# Title\n\nSetup.\n")
    provenance.stamp(path, provenance.parse(line))
    assert path.read_text() == f"# Title\n\n{line}\n\nSetup.\n"
    again = provenance.Provenance("1234567", True, "clean", "(1 min) median 1.0, max 2.0 on 2 cores", "0", "python y.py")
    provenance.stamp(path, again)
    assert provenance.parse(path.read_text()) == again and path.read_text().count("Measured: ") == 1


def test_a_commit_stales_only_the_results_its_moves_trailer_names(tmp_path: Path, monkeypatch) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()

    def change(message: str) -> None:
        (tmp_path / "code.py").write_text((tmp_path / "code.py").read_text() + "x = 1\n")
        git("commit", "-qam", message)

    git("init", "-q")
    (tmp_path / "code.py").write_text("")
    git("add", "code.py")
    git("commit", "-qm", "measured here")
    measured = provenance.Provenance(git("rev-parse", "HEAD"), True, "clean", "0.1", "0", "python x.py")
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    change("pace grown messages\n\nWhy only the filter's runs can move.\n\nMoves-results: value_filter faults")
    change("no figure moves\n\nMoves-results: none")
    assert provenance.changes_since(measured, ["code.py"], "time_to_accuracy") == []
    assert [c.split(" ", 1)[1] for c in provenance.changes_since(measured, ["code.py"], "faults")] == \
        ["pace grown messages"]
    change("a change without the trailer")
    assert [c.split(" ", 1)[1] for c in provenance.changes_since(measured, ["code.py"], "time_to_accuracy")] == \
        ["a change without the trailer"]
    assert len(provenance.changes_since(measured, ["code.py"])) == 3  # no name: every change
    assert provenance.changes_since(measured, ["other.py"], "faults") == []


def test_every_results_file_is_registered_and_says_what_it_measured() -> None:
    names = stale.results_names()
    assert sorted(REGISTRY) == names
    for name in names:
        measured = provenance.read(name)
        assert measured is not None, f"experiments/results/{name}.md has no Measured: line"
        script = next((w for w in REGISTRY[name].command.split() if w.startswith("experiments/")), None)
        assert script is None or (ROOT / script).exists(), REGISTRY[name].command


def _in_git_checkout() -> bool:
    return subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True).returncode == 0


@pytest.mark.skipif(not _in_git_checkout(), reason="staleness is judged from git's history")
def test_readme_and_docs_quote_their_results() -> None:
    docs = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
    stale_of = {}

    def source(path: str) -> claims.Source:
        name = Path(path).stem
        if name not in stale_of:
            stale_of[name] = bool(stale.why_stale(name)) if name in REGISTRY else True
        measured = provenance.read(name)
        return claims.Source(path, measured.commit if measured else "", stale_of[name])

    def read(path: str) -> str:
        return (ROOT / path).read_text()

    found = [c for doc in docs for c in claims.parse(doc, read(doc))]
    assert len(found) > 40  # the parser still finds the claims
    problems = claims.check(found, read, source, lambda page: claims.parse(page, read(page)))
    assert problems == [], "\n" + "\n".join(problems)
