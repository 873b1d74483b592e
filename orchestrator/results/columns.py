"""The columns of a trial's row, declared once: names, types, units and meanings.

A row is what one window of a trial leaves in the store (``results/store``): a JSON object whose
keys are this module's :data:`ROW_COLUMNS`, and nothing else. The trial fills it
(``measuring/trial.py``, ``measuring/command.py``), ``results/rows.py`` builds and judges it,
the launcher's supervisor adds only its :class:`LaunchFacts` (``results.rows.add_launch``), and
``analysis`` and the store read it by these names. A column that is written somewhere but not
declared here is a defect: :func:`undeclared` finds it, and the tests run real trials through it.

Units are in the names (``_s``, ``_j``, ``_w``, ``_mhz``, ``_bytes``, ``_c``) or in the comment.
This module imports nothing of the project, so any floor may read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypedDict, get_type_hints


class ProgramWindow(TypedDict):
    """One window a user's program measured (``workload=command``): a ``program_windows`` entry."""

    name: str  # the window's name in the program (``dvfs.window(name)``)
    time_s: float  # s of device time it spanned
    energy_j: float | None  # J over it (None: no energy reading)
    items: float | None  # units of work it covered (samples, tokens)
    calls: int  # steps it charged
    busy_s: float  # s the device was busy in it


class LaunchFacts(TypedDict, total=False):
    """How the ``ray_gpus`` launcher ran a trial: a row's ``launch`` column (the same on each of
    a trial's rows). Absent keys: that fact does not apply (a trial that ran has no ``died_at``).
    """

    launcher: str  # "ray_gpus"
    host: str  # the worker's host
    node_id: str | None  # the Ray node
    worker_pid: int  # the worker's process id
    ray_gpu_id: str  # the GPU id Ray gave the worker
    worker_restarts: int  # how often this GPU's worker was replaced before the trial
    job_num: int  # the job's number in its Hydra batch
    dispatched_at: float | None  # Unix s the driver sent the trial
    trial_started_at: float | None  # Unix s the worker began it
    trial_ended_at: float | None  # Unix s it ended
    trial_s: float | None  # s it ran (a monotonic clock's)
    builds: int  # kernels the worker had built by its end
    died_at: float  # Unix s the driver saw the worker die
    killed_at: float  # Unix s the driver killed a worker whose trial ran past its time


@dataclass
class TrialRow:
    """Every column of a trial's row, with its type, unit and meaning; ``None`` until the trial
    fills it. A stored row is a dict of these names (``dataclasses.asdict`` of one of these, then
    filled), and nothing else: :func:`undeclared` names what is not declared here."""

    # identity
    schema_version: int  # the row layout's version (``SCHEMA_VERSION`` of ``results.rows``)
    sweep_id: str  # the last two parts of the store directory
    trial_key: str  # hash of what is measured and the GPU's UUID (``JobSpec.trial_key``)
    repeat: int  # the window's number within its trial, from 0
    attempt: int  # 1 for a trial's first run; a re-run of a trial stored before adds one
    host: str  # the host the trial ran on
    started_at: float  # Unix seconds the row's window (or trial) began
    ended_at: float | None  # Unix seconds it ended
    device_index: int  # NVML index of the GPU
    device_uuid: str  # the GPU's UUID
    device_name: str  # e.g. NVIDIA A100-SXM4-40GB
    driver_version: str | None  # the driver's version string
    backend: str  # nvml, sim, cpu or tpu
    framework: str  # jax, tensorflow or pytorch (a program's label for workload=command)
    framework_version: str | None  # the framework's version string
    workload: str  # the workload's own name (a program's label)
    size: str  # the size preset computed: tiny, cpu or gpu
    sim_size: str | None  # the preset the sim charges each call at (None off the sim)
    dtype: str  # float32, bfloat16...
    precision: str  # default, highest, tf32
    # settings asked for
    sm_clock_min_mhz: int | None  # MHz; None: the device's default (so for every setting)
    sm_clock_max_mhz: int | None  # MHz
    mem_clock_mhz: int | None  # MHz
    power_limit_w: float | None  # W
    clock_offset_mhz: int | None  # MHz, added to the SM clock curve
    default_setting: bool  # nothing asked: the device's own setting
    # observed
    observed_sm_clock_mhz: float | None = None  # MHz, the window's mean
    avg_power_w: float | None = None  # W, the window's mean
    peak_power_w: float | None = None  # W, the highest reading in the window
    temperature_start_c: float | None = None  # the die when the window began
    temperature_c: float | None = None  # the die after the window: a hot window's rise
    throttle_reasons: list[str] = field(default_factory=list)  # NVML reasons seen in the window
    # measured
    iterations: int | None = None  # kernel calls in the window
    time_s: float | None = None  # s, the window's device time
    time_per_iter_s: float | None = None  # s per call
    throughput: float | None = None  # calls per s
    tflops: float | None = None  # TFLOP/s of the analytic counts
    gbps: float | None = None  # GB/s of the analytic bytes
    energy_j: float | None = None  # J over the window (None: no energy reading)
    energy_per_iter_j: float | None = None  # J per call
    energy_per_tflop_j: float | None = None  # J per TFLOP
    energy_per_gb_j: float | None = None  # J per GB moved
    rate_unit: str | None = None  # the workload's throughput unit: TFLOP/s, GB/s, samples/s...
    rate: float | None = None  # the throughput in that unit
    items_per_call: int | None = None  # samples (or tokens) per call, for samples/s, tokens/s
    energy_per_item_j: float | None = None  # joules per sample (or token)
    # device memory
    peak_memory_bytes: int | None = None  # the trial's peak (the sim's model on the sim)
    framework_peak_bytes: int | None = None  # what the framework itself reports (None: JAX/CPU)
    memory_source: str | None = None  # where peak_memory_bytes comes from
    memory_used_before_bytes: int | None = None  # NVML used, before the kernel was built
    memory_used_after_bytes: int | None = None  # NVML used, after the window
    # checks
    rel_error: float | None = None  # ||out - ref|| / ||ref||, in float64
    max_abs_error: float | None = None  # max |out - ref|
    nonfinite_count: int | None = None  # NaN and inf elements in the checked outputs
    determinism_mismatches: int | None = None  # checked calls whose fingerprint differed
    status: str | None = None  # ``results.rows.Status``
    failed_by: str | None = None  # setting, device or circumstances (see ``failed_by``)
    error: str | None = None  # what went wrong, one line (a traceback for a crash)
    valid: bool = False  # the window shows what was asked (``results.rows.validity``)
    invalid_reason: str | None = None  # why not
    # how the energy was measured
    meter: str | None = None  # counter, polling or none
    energy_counter_updates: int | None = None  # counter updates the window spanned
    energy_counter_period_s: float | None = None  # s between counter updates
    window_aligned: bool | None = None  # the window began and ended on counter edges
    energy_note: str | None = None  # why there is no energy reading
    # the work the device was charged (the sim) or ran
    charged_flops: float | None = None  # FLOP of one call as compiled (kernels.cost)
    charged_bytes: float | None = None  # bytes one call moves as compiled
    charged_launches: int | None = None  # device kernels one call launches
    charged_transcendentals: float | None = None  # exp, log, tanh... (in charged_flops, one each)
    work_kind: str | None = None  # "matmul", "conv" or "elementwise" (kernels.cost.WorkKind)
    work_source: str | None = None  # where the figures come from (kernels.cost.WorkSource)
    work_note: str | None = None  # why the analytic counts were charged
    # the check run after the window
    digest: str | None = None  # measure.digest: when the checked calls ran (after)
    checked_iters: int | None = None  # calls of the check run
    check_time_s: float | None = None  # s the check run took
    outputs_sampled: int | None = None  # outputs held for the reference check
    outputs_compared: int | None = None  # ... of which compared: bitwise-equal ones once
    samples_note: str | None = None  # why fewer were held than asked (measure.held_outputs_share)
    check_arithmetic: str | None = None  # the device's float32 matmul at precision=default
    size_requested: str | None = None  # workload.size as asked ("auto": size is what it chose)
    footprint_bytes: int | None = None  # device memory the trial needs (measuring.memory)
    footprint_note: str | None = None  # its parts: inputs, output, temporaries, reference, held
    device_free_bytes: int | None = None  # free device memory before the trial (None: unknown)
    host_peak_bytes: int | None = None  # the process's peak resident memory during the trial
    tpu_duty_cycle_pct: float | None = None  # a TPU: libtpu's duty cycle after the window
    tpu_tensorcore_util_pct: float | None = None  # ... and its tensor-core utilisation
    steady_note: str | None = None  # measure.steady_start did not get there in its time
    bytes_to_host: int | None = None  # outputs and check results copied to the host
    # where the trial's wall time went, in seconds (``PHASES``): the trial's own phases (build,
    # settings, warm-up) on repeat 0, the restore on the last repeat, each repeat's on its row;
    # ``wall_s`` is the row's sum, so a trial's rows add up to its wall time
    phase_build_s: float | None = None  # kernel build/compile and the work it is charged
    phase_settings_s: float | None = None  # settings applied and measure.settle_s
    phase_steady_s: float | None = None  # measure.steady_start: warming or cooling the die
    phase_warmup_s: float | None = None  # measure.warmup_iters calls
    phase_edge_wait_s: float | None = None  # waits for the energy counter's edges
    phase_window_s: float | None = None  # the timed window's calls
    phase_check_run_s: float | None = None  # the checked calls after the window
    phase_compare_s: float | None = None  # the reference (repeat 0, once per kernel), comparing
    phase_restore_s: float | None = None  # the guard putting the device back
    wall_s: float | None = None  # s, the sum of the row's phases
    # a user's program (workload=command, `dvfs monitor`): orchestrator.measuring.command
    exit_code: int | None = None  # the program's exit status (negative: killed by that signal)
    program_wall_s: float | None = None  # the program's run, start to exit, host seconds
    items: float | None = None  # the units of work the row's windows covered (samples, tokens)
    result: Any = None  # what the program reported (dvfs.report_result): a number or a map
    reference_result: Any = None  # ... at the device's default setting, compared with it
    program_windows: list[ProgramWindow] = field(default_factory=list)  # its windows, each one
    # provenance
    config: dict[str, Any] = field(default_factory=dict)  # the job's resolved config
    versions: dict[str, str] = field(default_factory=dict)  # library -> version
    git_commit: str | None = None  # the project's commit
    config_hash: str | None = None  # hash of what is measured, the same on every GPU
    # how the driver ran it (the ``ray_gpus`` launcher only: ``results.rows.add_launch``)
    launch: LaunchFacts | None = None


ROW_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(TrialRow))
"""The names of a row's columns, in the order a reader meets them."""
NESTED_KEYS: Mapping[str, frozenset[str]] = {
    "launch": frozenset(get_type_hints(LaunchFacts)),
    "program_windows": frozenset(get_type_hints(ProgramWindow)),
}
"""A column whose value is a map (or a list of maps) of declared keys -> those keys."""


def undeclared(row: Mapping[str, Any]) -> list[str]:
    """The keys of ``row`` that :class:`TrialRow` does not declare, and those of its declared
    maps (``launch.x``, ``program_windows.x``) that their type does not: [] for a good row."""
    found = sorted(set(row) - set(ROW_COLUMNS))
    for column, keys in NESTED_KEYS.items():
        value = row.get(column)
        maps = value if isinstance(value, list) else [value] if value else []
        found += sorted({f"{column}.{k}" for m in maps for k in m if k not in keys})
    return found
