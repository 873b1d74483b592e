"""Where a result came from: the code's commit and the versions of what computed it.

Stamped on every row (``rows.base_row``), so a figure can be traced to the software that made it.
The package's own version is read from its installed metadata (``pyproject.toml``'s ``version``),
never written twice: a source tree that was never installed reads the same line from its
``pyproject.toml``. The commit is recorded only where the package runs from a git checkout (a
wheel installed into a virtual environment that sits inside someone's repository has none, and
must not take that repository's commit for its own).
"""

from __future__ import annotations

import importlib.metadata as md
import platform
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

DISTRIBUTION = "dvfs-orchestrator"


CHECKOUT = Path(__file__).resolve().parents[2]
"""Where a checkout's root would be: orchestrator/results/ -> the repository (or, installed from a
wheel, site-packages, which has neither ``.git`` nor ``pyproject.toml``)."""


@lru_cache(maxsize=1)
def package_version() -> str:
    """This package's version: its installed metadata, else (a source tree on ``PYTHONPATH``,
    never installed) its ``pyproject.toml``; "unknown" if neither says."""
    try:
        return md.version(DISTRIBUTION)
    except md.PackageNotFoundError:
        pass
    try:
        import tomllib

        project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]
    except (OSError, ValueError, KeyError):
        return "unknown"
    return str(project.get("version", "unknown")) if project.get("name") == DISTRIBUTION \
        else "unknown"


@lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the checkout this package runs from; None for an installed wheel."""
    root = CHECKOUT
    if not (root / ".git").exists():  # a directory, or a worktree's file
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@lru_cache(maxsize=1)
def _distribution_versions() -> tuple[tuple[str, str], ...]:
    """The versions of the distributions a result depends on, read once per process (1.4 ms a
    read here, twice a trial before): an install under a running sweep does not change the code
    its processes run either."""
    versions = [("python", platform.python_version()), (DISTRIBUTION, package_version())]
    for dist in ("numpy", "nvidia-ml-py", "ray", "hydra-core"):
        try:
            versions.append((dist, md.version(dist)))
        except md.PackageNotFoundError:
            pass
    return tuple(versions)


def library_versions(framework: str | None = None) -> dict[str, str]:
    """Versions that matter for a result (the framework only if already imported)."""
    versions = dict(_distribution_versions())
    if framework == "jax" and "jax" in sys.modules:
        versions["jax"] = sys.modules["jax"].__version__
    if framework == "tensorflow" and "tensorflow" in sys.modules:
        versions["tensorflow"] = sys.modules["tensorflow"].__version__
    if framework == "pytorch" and "torch" in sys.modules:
        versions["torch"] = str(sys.modules["torch"].__version__)
    return versions
