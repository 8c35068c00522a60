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
