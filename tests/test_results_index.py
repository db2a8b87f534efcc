"""The committed results are indexed and cited: `results/` and `benchmarks/results/` each hold at most 40 files, each
has a README whose table lists exactly the files in the folder, every results file that README.md or a page of docs/
names exists, and every results file is named by a page or by its folder's index."""
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ["results", "benchmarks/results"]
MOST = 40
PAGES = ["README.md"] + sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))
# a path into a results folder, as a link (../results/...) or as text (`benchmarks/results/...`); not work/results/...
CITED = re.compile(r"(?<![\w/.-])(?:\.\./)*((?:benchmarks/)?results/(?:[\w.-]+/)*(?:[\w.-]+\.(?:md|json|txt|csv|png))?)")
ROW = re.compile(r"^\| \[([^\]]+)\]\(([^)]+)\) \|")


def files_in(folder):
    """The folder's files that git knows (tracked, or new and not ignored) and that exist, relative to the folder."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", folder], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.split()
    return sorted(Path(p).relative_to(folder).as_posix() for p in set(out) if (REPO / p).is_file())


def cited_paths(page):
    """The results paths a page names outside its code blocks (a command's --out there may name a file to come)."""
    text = re.sub(r"```.*?```", "", (REPO / page).read_text(encoding="utf-8"), flags=re.S)
    return {match.group(1) for match in CITED.finditer(text)}


def index_rows(folder):
    rows = []
    for line in (REPO / folder / "README.md").read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            assert match.group(1) == match.group(2), f"{folder}/README.md: {line[:120]}"
            rows.append(match.group(1))
    return rows


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_results_folder_holds_at_most_40_files(folder):
    files = files_in(folder)
    assert len(files) <= MOST, f"{folder}: {len(files)} files, at most {MOST}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_folder_index_lists_exactly_its_files(folder):
    rows = index_rows(folder)
    assert len(rows) == len(set(rows)), f"{folder}/README.md lists a file twice"
    files = [name for name in files_in(folder) if name != "README.md"]
    assert sorted(rows) == files, (f"{folder}/README.md: not listed {sorted(set(files) - set(rows))}, "
                                   f"listed but absent {sorted(set(rows) - set(files))}")


@pytest.mark.parametrize("page", PAGES)
def test_every_results_path_a_page_cites_exists(page):
    missing = sorted(path for path in cited_paths(page) if not (REPO / path).exists())
    assert not missing, f"{page} cites results that do not exist: {missing}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_results_file_is_cited(folder):
    cited = set().union(*(cited_paths(page) for page in PAGES))
    indexed = set(index_rows(folder))
    uncited = [name for name in files_in(folder)
               if name != "README.md" and f"{folder}/{name}" not in cited and name not in indexed]
    assert not uncited, f"{folder}: files no page cites and the index does not list: {uncited}"


def test_the_pages_cite_results():
    """The pattern finds what it is for (a results path changed to another form would otherwise pass unseen)."""
    assert "results/compare_attention/conv/demo_u600.md" in cited_paths("README.md")
    assert any(path.startswith("benchmarks/results/") for path in cited_paths("README.md"))
    assert not CITED.search("work/results/wmt14_en_de/table1.md")
