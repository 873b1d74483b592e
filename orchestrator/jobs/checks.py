"""The checks of a job's config that need more than its schema: made once, when the job is made.

``config.validate_static`` checks each value against its schema and range; what is checked here
needs the kernel registry, the program to run, or what the simulated GPU may inject:

- :func:`validate_workload`: workload x framework x size x dtype x precision, against the
  registry (a user's workload is loaded here, on the driver);
- :func:`command_job`: a program (``workload=command``) that can start, where it will run;
- :func:`validate_inject`: a ``device.inject`` fault (the sim's only).

``jobs.job.JobSpec`` calls each once and carries what they found; nothing downstream checks again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config import AUTO_SIZE, COMMAND, DvfsConfig
from orchestrator.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kernels.spec import KernelSpec

FAULT_ACTIONS = ("hang_s", "exit_process", "raise_error", "lose_gpu", "pause_s", "slow_s")
FAULT_KEYS = ("at_call", "gpu", "workload", "times", *FAULT_ACTIONS)


def validate_workload(cfg: DvfsConfig) -> KernelSpec | None:
    """Check workload x framework x size x dtype x precision against the kernel registry.

    A user's workload (``workload=custom workload.target=...``, or an entry point's name) is
    loaded here, on the driver, so a target that does not import or a factory that returns
    something else is a one-line error before any device is touched.

    Returns:
        The workload's ``kernels.Workload``; None for ``workload=command`` (a user's program,
        checked by ``config.validate_static``: it is no kernel).

    Raises:
        UserError: an unknown workload or one that does not load; a framework, size, dtype or
            precision the workload does not have; a framework that is not installed (PyTorch,
            an extra: the line names it).
    """
    from kernels.build import check_framework
    from kernels.frameworks import FRAMEWORKS, missing_framework
    from kernels.registry import load_workload
    from kernels.spec import KernelOptionError

    if cfg.framework.name not in FRAMEWORKS:
        raise UserError(f"framework={cfg.framework.name!r} is not one of: {', '.join(FRAMEWORKS)}")
    if cfg.workload.name == COMMAND:  # a program: the framework is its label, its own to import
        return None
    missing = missing_framework(cfg.framework.name)
    if missing is not None:
        raise UserError(missing)
    try:
        spec = load_workload(cfg.workload.name, getattr(cfg.workload, "target", None))
        check_framework(spec, cfg.framework.name)
        size = cfg.workload.size
        spec.validate(spec.presets[0] if size == AUTO_SIZE else size, cfg.workload.dtype,
                      cfg.framework.precision)
        if cfg.workload.sim_size is not None:
            spec.validate(cfg.workload.sim_size, cfg.workload.dtype, cfg.framework.precision)
    except KernelOptionError as e:
        raise UserError(str(e)) from e
    return spec


def command_job(config: DvfsConfig) -> DvfsConfig:
    """A program's job: where it runs made absolute (where ``dvfs`` was started, by default),
    so a worker elsewhere runs it there too; a program that cannot start is refused here."""
    import dataclasses

    workload = config.workload
    argv = workload.argv
    if isinstance(argv, (str, bytes)) or not argv or not all(
            isinstance(a, (str, int, float)) for a in argv):
        raise UserError("workload=command needs workload.argv=[program,arg,...], e.g. "
                        "workload.argv=[python,train.py,--steps,200]")
    cwd = str(Path(workload.cwd or os.getcwd()).absolute())
    check_program(argv, cwd)
    if workload.cwd == cwd:
        return config
    return dataclasses.replace(config, workload=dataclasses.replace(workload, cwd=cwd))


def check_program(argv: Sequence[Any], cwd: str | None) -> None:
    """Refuse a program that cannot start (one line, before any device is touched)."""
    import shutil

    args = [str(a) for a in argv]
    if not args:
        raise UserError("no program to run: give one after --, e.g. -- python train.py")
    where = Path(cwd or ".")
    if not where.is_dir():
        raise UserError(f"workload.cwd={cwd}: no such directory")
    if args[0] in ("python", "python3"):  # run as dvfs's own Python (command.program_argv)
        return
    if os.sep in args[0]:
        found = (where / args[0]).exists()
    else:
        found = shutil.which(args[0]) is not None
    if not found:
        raise UserError(f"{args[0]}: no such program (on PATH, or in {where.resolve()})")


def validate_inject(spec: Any, backend: str) -> dict[str, Any] | None:
    """Check a ``device.inject`` value (``measuring/inject.py`` says what each key does); returns
    it as a plain dict (None: no injection).

    Raises:
        UserError: an unknown key, no action or two, a bad value, or a backend other than sim.
    """
    if spec is None:
        return None
    if hasattr(spec, "items"):
        spec = {str(k): v for k, v in spec.items()}
    else:
        raise UserError(f"device.inject={spec!r} must be a dict, e.g. {{hang_s: 30, at_call: 2}}")
    if not spec:
        return None
    if backend != "sim":
        raise UserError(
            f"device.inject is a test-and-chaos knob of the simulated GPU; refused on "
            f"device.backend={backend}"
        )
    unknown = sorted(set(spec) - set(FAULT_KEYS))
    if unknown:
        raise UserError(
            f"device.inject: unknown key(s) {', '.join(unknown)}; known: {', '.join(FAULT_KEYS)}"
        )
    actions = [a for a in FAULT_ACTIONS if spec.get(a) not in (None, False)]
    if len(actions) != 1:
        raise UserError(
            f"device.inject needs exactly one of {', '.join(FAULT_ACTIONS)}; "
            f"got {actions or 'none'}"
        )
    at_call = spec.get("at_call", 1)
    if not isinstance(at_call, int) or at_call < 1:
        raise UserError(f"device.inject.at_call={at_call!r} must be a call number from 1")
    times = spec.get("times", 1)
    if times is not None and (not isinstance(times, int) or times < 1):
        raise UserError(f"device.inject.times={times!r} must be 1 or more, or null (every trial)")
    for key in ("hang_s", "pause_s", "slow_s"):
        if spec.get(key) is not None and not float(spec[key]) > 0:
            raise UserError(f"device.inject.{key}={spec[key]} must be greater than 0")
    return spec
