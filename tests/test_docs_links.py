"""Every relative link in the project's Markdown reaches a file that exists and, with a #fragment, a heading of that
file (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens), so that moving a section or a file
cannot leave a reader at a dead link."""
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the Markdown files git knows: tracked, or new and not ignored
DOCS = sorted(REPO / name for name in subprocess.run(
    ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"], cwd=REPO, capture_output=True,
    text=True, check=True).stdout.split() if (REPO / name).exists())
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path):
    """The anchors GitHub gives the headings of a Markdown file."""
    found = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if heading:
            text = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            found.add(text.replace(" ", "-"))
    return found


def relative_links(path):
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)  # code blocks hold no links
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(REPO)) for p in DOCS])
def test_relative_links_reach_a_file_and_a_heading(doc):
    dead = []
    for target in relative_links(doc):
        file, _, fragment = target.partition("#")
        linked = (doc.parent / file).resolve() if file else doc
        if not linked.exists():
            dead.append(target)
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            dead.append(target)
    assert not dead, f"{doc.relative_to(REPO)}: dead links {dead}"
