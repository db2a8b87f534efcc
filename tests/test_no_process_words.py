"""The repository speaks to its users: no words about how it was made in its text files or in its file and folder
names, and the README's table of --fw-* flags is fw_fairseq/modules/flag_table.py's, with each preset's values.

The text files are those git knows (tracked, or new and not ignored) ending in .md, .py, .sh, .txt, .cfg or .toml;
the names are every such path's folders and file name."""
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEXT = (".md", ".py", ".sh", ".txt", ".cfg", ".toml")
WORDS = re.compile(r"\bsessions?\b|\bissue [0-9]|\blent\b", re.IGNORECASE)
# pytest's own word: fixtures of scope="session" (and this file's patterns, which must name what they look for)
ALLOWED = re.compile(r"""scope\s*=\s*["']session["']""")
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()


def repository_files():
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return sorted({path for path in out.decode("utf-8").split("\0") if path and (REPO / path).is_file()})


def process_words(text):
    return WORDS.findall(ALLOWED.sub("", text))


def test_no_process_words_in_text_files():
    found = []
    for path in repository_files():
        if not path.endswith(TEXT) or path == THIS:
            continue
        text = (REPO / path).read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            words = process_words(line)
            if words:
                found.append(f"{path}:{number}: {', '.join(words)}: {line.strip()[:160]}")
    assert not found, "process words in text files:\n" + "\n".join(found)


def test_no_process_words_in_file_or_folder_names():
    found = set()
    for path in repository_files():
        for part in Path(path).parts:
            # underscores, dashes and dots separate the words of a name
            if process_words(re.sub(r"[_.\-]", " ", part)):
                found.add(path)
    assert not found, "process words in names:\n" + "\n".join(sorted(found))


def test_the_patterns_find_what_they_are_for():
    assert process_words("this session's machine") and process_words("Against issue 14's targets")
    assert process_words("on the lent machine") and process_words("a run in Sessions 3-4")
    assert not process_words('@pytest.fixture(scope="session")')
    assert not process_words("equivalent, excellent, wrap_session, the issue of scale")


def flag_rows():
    """The README's rows of the --fw-* table, as flag_table.py gives them: flag, values, its value in each preset."""
    from fw_fairseq.modules.flag_table import FAVOR, FLAGS, PRESETS, Derived

    def values(flag):
        choices = flag.options.get("choices")
        return ", ".join(f"`{c}`" for c in choices) if choices else f"`{flag.options.get('metavar')}`"

    def shown(value):
        return int(value) if isinstance(value, bool) or (isinstance(value, float) and value.is_integer()) else value

    def default(flag, preset):
        if flag.name == "--fw-preset":
            return f"`{preset}`"
        value, favor = PRESETS[preset].get(flag.name), FAVOR.get(preset, {}).get(flag.name)
        text = "`--fw-update-rule`" if value is None else value.text if isinstance(value, Derived) else \
            f"`{shown(value)}`"  # a per-block rule absent from a preset follows --fw-update-rule
        return text if favor is None else f"{text}; `{shown(favor)}` with `--fw-feature-map favor`"

    return {flag.name: f"| `{flag.name}` | {values(flag)} | "
                       + " | ".join(default(flag, preset) for preset in PRESETS) + " |" for flag in FLAGS}


def test_readme_flag_table_is_the_flag_table():
    readme = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    rows = {m.group(1): line for line in readme if (m := re.match(r"\| `(--fw-[a-z0-9-]+)` \|", line))}
    expected = flag_rows()
    assert sorted(rows) == sorted(expected), "README's --fw-* table lists other flags than flag_table.py"
    wrong = [f"README: {rows[name]}\nflag_table.py: {row} ..." for name, row in expected.items()
             if not rows[name].startswith(row)]
    assert not wrong, "README's --fw-* rows differ from flag_table.py:\n" + "\n".join(wrong)
