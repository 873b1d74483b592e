"""The docs name only what exists: every repository path in the README, docs/ and module docstrings.

What counts as a repository path (backticked or not):

- a token that starts with one of the repository's top-level folders and a slash
  (``orchestrator/launching/pool.py``, ``data/measured/``, ``scripts/test``): it must exist;
- a token with a slash that ends in ``.py``, ``.md`` or ``.yaml`` (``launching/pool_join.py``,
  a path inside a wing): some file of the repository must end with it;
- a Markdown link's target that is not a URL or an anchor (``[x](simulator.md#calibration)``,
  ``../README.md``): it must exist, from the page's own folder.

A placeholder ends the token (``data/measured/<date>_<board>_check/`` checks ``data/measured/``),
a ``*`` makes it a glob that must match, and a token whose first part is in capitals
(``DIR/experiment/mine.yaml``, ``PWD/...``) names the user's folder, not the repository's. A bare
file name (``train.py``, ``check.md``) is not checked: the docs name the user's files that way.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("analysis", "conf", "data", "docs", "dvfs", "examples", "hydra_plugins", "kernels",
       "orchestrator", "scripts", "tests")
"""The repository's top-level folders: a token starting with one of them is a repository path."""
DOCSTRING_PACKAGES = ("orchestrator", "kernels", "analysis", "dvfs", "scripts", "hydra_plugins")

_EDGE = r"(?<![\w./~$:@-])"
ROOTED = re.compile(_EDGE + r"((?:%s)/[\w./*<>{}-]*)" % "|".join(TOP))
INNER = re.compile(_EDGE + r"((?:[\w-]+/)+[\w.-]+\.(?:py|md|yaml))(?![\w/])")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def texts() -> list[tuple[Path, str]]:
    """(file, text) of the README, every page of docs/ and every module docstring."""
    found = [(ROOT / "README.md", (ROOT / "README.md").read_text())]
    found += [(p, p.read_text()) for p in sorted((ROOT / "docs").glob("*.md"))]
    for package in DOCSTRING_PACKAGES:
        for p in sorted((ROOT / package).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(p.read_text()), clean=False)
            if doc:
                found.append((p, doc))
    return found


def all_files() -> list[str]:
    skip = {".venv", ".git", "outputs", "multirun", "build", "dist"}
    return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def trimmed(token: str) -> str:
    """The token up to its first placeholder, without trailing punctuation."""
    token = re.split(r"[<{]", token, maxsplit=1)[0]
    return token.rstrip(".,;:")


def rooted_exists(token: str, base: Path = ROOT) -> bool:
    if "*" in token:
        return any(base.glob(token))
    return (base / token).exists()


def named_paths() -> list[tuple[Path, str, bool]]:
    """(file, path as named, whether it exists) for every repository path the texts name."""
    files = all_files()
    named = []
    for source, text in texts():
        rooted = set()
        for m in ROOTED.finditer(text):
            token = trimmed(m.group(1))
            rooted.add(m.start(1))
            if token.count("/") and token.rstrip("/").split("/")[-1]:
                named.append((source, token, rooted_exists(token)))
            else:
                named.append((source, token, (ROOT / token).is_dir()))
        for m in INNER.finditer(text):
            token = m.group(1)
            if m.start(1) in rooted or token.split("/")[0].isupper() or token.startswith(".."):
                continue
            named.append((source, token, any(f == token or f.endswith("/" + token)
                                             for f in files)))
        if source.suffix == ".md":
            for m in LINK.finditer(text):
                target = m.group(1)
                if re.match(r"[a-z]+:", target):  # https:, mailto:
                    continue
                named.append((source, target, rooted_exists(target, source.parent)))
    return named


@pytest.mark.slow
def test_every_repository_path_the_docs_name_exists():
    named = named_paths()
    missing = [f"{source.relative_to(ROOT)}: {token}" for source, token, ok in named if not ok]
    assert not missing, "paths named but not in the repository:\n" + "\n".join(missing)
    assert len(named) > 300  # the patterns still find the docs' paths


def test_a_path_that_does_not_exist_is_caught(monkeypatch):
    page = ROOT / "docs" / "design.md"
    text = "See `orchestrator/nowhere.py`, `launching/nowhere.py` and [it](nowhere.md#x)."
    monkeypatch.setattr(sys.modules[__name__], "texts", lambda: [(page, text)])
    bad = {token for _, token, ok in named_paths() if not ok}
    assert bad == {"orchestrator/nowhere.py", "launching/nowhere.py", "nowhere.md"}


def test_no_doc_cites_a_folder_outside_the_repository():
    outside = [f"{source.relative_to(ROOT)}" for source, text in texts()
               if re.search(r"(?<![\w-])shared[/](DESIGN|CALIBRATION)", text)]
    assert not outside
