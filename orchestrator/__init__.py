"""dvfs-orchestrator: GPU energy and stability experiments.

The package is layered (see ``../shared/DESIGN.md``): ``devices`` at the bottom knows nothing of
the rest; ``guard`` and ``meter`` sit on devices; ``trial`` runs one measured point; ``worker`` and
``launch`` spread trials over Ray actors; ``cli`` is the user's entry point. Nothing here imports
JAX, TensorFlow or Ray at module level, so ``dvfs --help`` stays fast.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dvfs-orchestrator")  # pyproject.toml's, the one place it is written
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "unknown"
