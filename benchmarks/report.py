"""``docs/benchmarks.md`` from the benchmarks' results: the page's text is
``benchmarks/page.md``; each ``<!-- results: <name> -->`` marker in it becomes the headline
sections of ``benchmarks/results/<name>.md`` with its plot (``tests/test_docs.py`` checks the
committed page).

    python -m benchmarks report
"""

import re
from pathlib import Path

from . import driver as D

DOC = D.ROOT / "docs" / "benchmarks.md"
PAGE = Path(__file__).with_name("page.md")
MARKER = re.compile(r"^<!-- results: (\S+) -->$", re.M)
# Of each report the sections whose headings start with one of COPIED are copied, in order.
COPIED = ("Ratios", "All methods", "Result", "The paper", "Headline")


def sections() -> list[tuple[str, str]]:
    """The page's ``## `` sections as (text, result name or None), the intro first."""
    parts = re.split(r"^(?=## )", PAGE.read_text(), flags=re.M)
    return [(p, (MARKER.search(p) or [None, None])[1]) for p in parts]


def results_of(name: str, title: str, results: Path) -> str:
    """The copied sections of ``results/<name>.md``, its plot and a link to the full report."""
    body = []
    split = re.split(r"^## (.*)$", (results / f"{name}.md").read_text(), flags=re.M)[1:]
    for heading, section in zip(split[::2], split[1::2]):
        if heading.startswith(COPIED):
            body += [f"#### {heading.strip()}", "", section.strip(), ""]
    if (results / f"{name}.png").exists():
        body += [f"![{title}](../benchmarks/results/{name}.png)", ""]
    return "\n".join(body + [f"Full report: [`{name}.md`](../benchmarks/results/{name}.md)."])


def render(results: Path = D.RESULTS) -> str:
    parts, missing = [], []
    for text, name in sections():
        if name is not None and not (results / f"{name}.md").exists():
            missing.append(name)
            continue
        if name is not None:
            title = text.split("\n", 1)[0].removeprefix("## ")
            text = text.replace(f"<!-- results: {name} -->", results_of(name, title, results))
        parts.append(text.rstrip())
    if missing:
        names = ", ".join(f"`{m}`" for m in missing)
        run = "Run `python -m benchmarks` to produce them."
        parts.append(f"## Not generated\n\nNo result files for: {names}. {run}")
    return "\n\n".join(parts) + "\n"


def main(argv=None):
    DOC.write_text(render())
    print(f"wrote {DOC.relative_to(D.ROOT)}")
