"""Stability thresholds by search: the lowest setting at which a kernel still computes right.

One search covers one ordered setting, on one GPU, for one computation (one group of the other
overrides: workload x framework x precision ...). The setting's values are the device's own
supported ones, ordered from the safest (the SM clock's maximum, the default power limit, a zero
clock offset) to the riskiest; the search looks for the riskiest value that is still stable,
and declares it stable once ``n`` clean iterations bound its fault rate by ``3 / n`` (95 %).

The rooms, each importable on its own:

- :mod:`~orchestrator.search.algorithm`: :class:`ThresholdSearch`, the pure state machine
  (coarse pass, bisection, confirmation), its :class:`Probe` and :class:`SearchResult`;
- :mod:`~orchestrator.search.space`: the ordered :data:`SETTINGS`, :class:`SearchOptions` and
  :func:`search_values` (the values a GPU supports, riskiest first);
- :mod:`~orchestrator.search.plan`: a sweep: the command line split into groups, one
  :class:`Target` per (group, GPU), batches to the launcher, each job's verdict from its
  ``JobResult`` (:func:`sweep`, what ``hydra/sweeper=stability`` hands off to);
- :mod:`~orchestrator.search.table`: the ``thresholds`` table (``thresholds.csv``, the schema
  ``dvfs report`` writes too), the ``search_trials`` meta item, the report's lines.

What a trial's rows say (:class:`orchestrator.results.rows.Outcome`,
:func:`orchestrator.results.rows.outcome_of`) is decided in :mod:`orchestrator.results.rows`, by the
one rule of what fails a setting. Units: MHz for clocks and offsets, W for power limits.
"""

from orchestrator.search.algorithm import (
    CONFIDENCE,
    CONFIRM_TRIALS,
    RULE_OF_THREE,
    Probe,
    Role,
    SearchResult,
    ThresholdSearch,
    ValueStats,
    coarse_indices,
    fault_rate_bound,
    run_search,
)
from orchestrator.search.plan import (
    GpuInfo,
    SplitArguments,
    StabilitySweep,
    Target,
    discover_gpus,
    job_result,
    next_batch,
    run_sweep,
    split_arguments,
    sweep,
)
from orchestrator.search.space import (
    DEFAULT_POWER_STEP_W,
    SETTINGS,
    OrderedSetting,
    SearchOptions,
    ordered_setting,
    plain_number,
    request_with,
    search_values,
)
from orchestrator.search.table import (
    SEARCH_TRIALS_META,
    THRESHOLDS_CSV,
    describe,
    record_trials,
    thresholds_table,
    write_thresholds,
)

__all__ = [
    "CONFIDENCE",
    "CONFIRM_TRIALS",
    "DEFAULT_POWER_STEP_W",
    "RULE_OF_THREE",
    "SEARCH_TRIALS_META",
    "SETTINGS",
    "THRESHOLDS_CSV",
    "GpuInfo",
    "OrderedSetting",
    "Probe",
    "Role",
    "SearchOptions",
    "SearchResult",
    "SplitArguments",
    "StabilitySweep",
    "Target",
    "ThresholdSearch",
    "ValueStats",
    "coarse_indices",
    "describe",
    "discover_gpus",
    "fault_rate_bound",
    "job_result",
    "next_batch",
    "ordered_setting",
    "plain_number",
    "record_trials",
    "request_with",
    "run_search",
    "run_sweep",
    "search_values",
    "split_arguments",
    "sweep",
    "thresholds_table",
    "write_thresholds",
]
