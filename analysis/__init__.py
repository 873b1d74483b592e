"""Analysis of sweep results: from stores to fronts, recommendations, thresholds and a report.

Everything but plotting is a pure function from a pandas DataFrame to a DataFrame, one row per
trial in (see :func:`load`), so each step can be checked, exported and reused:

- :func:`load` reads one or many results stores (``trials.sqlite``) into a frame; :func:`export`
  writes a frame to CSV or Parquet.
- :func:`aggregate_repeats` reduces the repeats of each setting to a median and a range.
- :func:`pareto_front` marks the energy/time Pareto front of each group.
- :func:`recommend` picks the minimum-energy, minimum-EDP, minimum-ED²P settings and the least
  energy within a slowdown budget, with savings against the device's default setting.
- :func:`compare` sets two frameworks (or two GPUs) side by side, setting by setting.
- :func:`framework_table` gives each framework's throughput, energy per item and memory at the
  settings all of them ran, with the study's published figures beside ours
  (:data:`STUDY_FIGURES`).
- :func:`thresholds` finds each GPU's stability threshold, with a bound on the fault rate.
- :mod:`analysis.plots` draws them and :mod:`analysis.report` writes the report; both import
  matplotlib only when called.

Groups: trials are comparable within :data:`DEFAULT_GROUP` (workload, size, dtype, precision,
framework, GPU model). Pass ``by=[..., "device_uuid"]`` for one result per physical GPU.
Units are in column names (``_s``, ``_j``, ``_w``, ``_mhz``). Nothing here touches a device or
imports JAX, TensorFlow or Ray.
"""

from analysis._frame import DEFAULT_GROUP, SETTING_COLUMNS, THRESHOLD_GROUP
from analysis.compare import compare
from analysis.frameworks import STUDY_FIGURES, PublishedFigure, framework_table
from analysis.load import ROW_COLUMNS, EmptyStoreError, export, load, load_meta, store_paths
from analysis.pareto import front_mask, pareto_front
from analysis.recommend import aggregate_repeats, recommend
from analysis.thresholds import thresholds

__all__ = [
    "DEFAULT_GROUP",
    "ROW_COLUMNS",
    "SETTING_COLUMNS",
    "STUDY_FIGURES",
    "THRESHOLD_GROUP",
    "EmptyStoreError",
    "PublishedFigure",
    "aggregate_repeats",
    "compare",
    "export",
    "framework_table",
    "front_mask",
    "load",
    "load_meta",
    "pareto_front",
    "recommend",
    "store_paths",
    "thresholds",
]
