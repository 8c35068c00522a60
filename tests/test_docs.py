"""The generated documentation matches the code that generates it."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_conjugacy_table_is_generated_from_the_test_matrix():
    sys.path.insert(0, str(ROOT))
    from benchmarks import conjugacy_table

    committed = (ROOT / "docs" / "conjugacy.md").read_text()
    assert conjugacy_table.render() == committed, (
        "docs/conjugacy.md is stale: run `python -m benchmarks conjugacy_table`"
    )


def test_benchmark_page_is_generated_from_the_results():
    sys.path.insert(0, str(ROOT))
    from benchmarks import report

    committed = (ROOT / "docs" / "benchmarks.md").read_text()
    assert report.render() == committed, (
        "docs/benchmarks.md is stale: run `python -m benchmarks report` (or the whole suite)"
    )
    # every benchmark's results are on the page: none is missing
    assert "## Not generated" not in committed


def test_report_copies_sections_not_numbers_typed_by_hand(tmp_path):
    sys.path.insert(0, str(ROOT))
    from benchmarks import report

    name = next(name for _, name in report.sections() if name)
    (tmp_path / f"{name}.md").write_text("# t\n\n## Ratios: x\n\n| a |\n|---|\n| 12345.6 |\n")
    page = report.render(tmp_path)
    assert "12345.6" in page and "#### Ratios: x" in page
    assert "## Not generated" in page  # the other results are absent from tmp_path
