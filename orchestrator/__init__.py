"""dvfs-orchestrator: GPU energy and stability experiments.

The package is layered (see ``../shared/DESIGN.md``): ``devices`` at the bottom knows nothing of
the rest; ``guard`` and ``meter`` sit on devices; ``trial`` runs one measured point; ``worker`` and
``launch`` spread trials over Ray actors; ``cli`` is the user's entry point. Nothing here imports
JAX, TensorFlow or Ray at module level, so ``dvfs --help`` stays fast.
"""


def __getattr__(name: str) -> str:
    """``orchestrator.__version__``: pyproject.toml's version, the one place it is written, read
    from the installed metadata when first asked (``results.provenance.package_version``)."""
    if name == "__version__":
        from orchestrator.results.provenance import package_version

        return package_version()
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
