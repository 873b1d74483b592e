"""dvfs-orchestrator's Hydra plugins (thin shells over ``orchestrator``).

Hydra finds plugins by walking the ``hydra_plugins`` namespace package and importing every module
in it, so this package must be a regular package (pkgutil does not walk into a directory without
``__init__.py``) and its modules must import nothing heavy: Ray, JAX and TensorFlow load only when a
launcher or sweeper runs.
"""
