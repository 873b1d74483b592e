"""Input hardening: any override a user can type is accepted and valid, or refused in one line.

A property-based test (hypothesis) composes ``conf/`` with random overrides of every field of every
config group (names and types taken from the dataclasses in ``orchestrator/config.py``), with
values of the right type and the wrong one, negatives, huge numbers, non-finite floats, strings
with spaces, quotes and unicode, interpolations and sweep syntax, plus unknown keys, unknown group
options, additions and deletions. It runs the validation path of a sweep in-process (compose,
``JobSpec.from_config``: ``validate_static`` + ``validate_workload`` + the settings request + the
inject knob's check, as every launcher makes them, and the guard's ``Policy.check`` against a
simulated A100) and asserts that each input is either accepted and valid, or refused with a
one-line ``UserError``; never another exception, and never a change to the simulated device. A
handful of the same inputs then go through ``dvfs sweep`` in a subprocess: exit 2, one line, no
traceback.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from support import DVFS

from orchestrator import config as C
from orchestrator.bounds import bounds
from orchestrator.errors import UserError, hydra_user_error

GROUPS: dict[str, type] = {
    "device": C.DeviceConfig,
    "workload": C.WorkloadConfig,
    "framework": C.FrameworkConfig,
    "measure": C.MeasureConfig,
}
OPTIONS = {
    "device": ["sim", "nvml", "cpu"],
    "workload": ["gemm", "stencil", "selu", "conv3d", "mlp_train", "hessian"],
    "framework": ["jax", "tensorflow"],
    "measure": ["default", "quick"],
    "experiment": ["quickstart", "null"],
}


def _fields(schema: type) -> list[tuple[str, Any]]:
    hints = typing.get_type_hints(schema)
    return [
        (f.name, hints[f.name])
        for f in dataclasses.fields(schema)
        if not dataclasses.is_dataclass(hints[f.name])
    ]


FIELDS: list[tuple[str, Any]] = [
    (f"{g}.{name}", t) for g, schema in GROUPS.items() for name, t in _fields(schema)
]
FIELDS += _fields(C.DvfsConfig)  # seed, objective, store_dir, quiet


# --- values, as the text after `key=` ----------------------------------------------------------
def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _float_text(x: float) -> str:
    return {math.inf: "inf", -math.inf: "-inf"}.get(x, "nan" if math.isnan(x) else repr(x))


ints = st.one_of(
    st.integers(-10**6, 10**6),
    st.sampled_from([0, -1, 2**31, 2**63, -(2**63), 10**30, -(10**30), 10**400]),
)
floats = st.floats(allow_nan=True, allow_infinity=True).map(_float_text)
words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
strings = st.one_of(
    words.map(_quote),  # any text, properly quoted
    words,  # the same text unquoted: spaces, quotes, '=', '$' ... as typed
    st.sampled_from([
        "a b", "'unterminated", '"x"', "ünïcødé", "日本", "${oops}", "${measure.window_s}",
        "${now:%H}", "1,2", "range(1,5)", "choice(a,b)", "[", "{", "a=b", "\\", "null", "??",
    ]),
)
scalars = st.one_of(ints.map(str), floats, st.sampled_from(["true", "false", "null"]), strings)
lists = st.lists(scalars, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]")
dicts = st.dictionaries(
    st.sampled_from(["a", "0", "gemm", "*", "hang_s", "at_call", "raise_error"]),
    scalars,
    max_size=2,
).map(lambda d: "{" + ",".join(f"{k}: {v}" for k, v in d.items()) + "}")
any_value = st.one_of(scalars, lists, dicts)


def _typed(t: Any) -> st.SearchStrategy[str]:
    """Values of the field's own type (the wrong types come from ``any_value``)."""
    args = [a for a in typing.get_args(t) if a is not type(None)]
    base = args[0] if typing.get_origin(t) is typing.Union and len(args) == 1 else t
    if base is bool:
        return st.sampled_from(["true", "false"])
    if base is int:
        return ints.map(str)
    if base is float:
        return st.one_of(floats, ints.map(str))
    if base is str:
        return st.one_of(strings, st.sampled_from([
            "sim", "nvml", "auto", "counter", "polling", "tiny", "cpu", "gpu", "float32",
            "bfloat16", "default", "tf32", "edp", "jax",
        ]))
    return any_value  # Any, list[Any]


def _field_override(draw: Any) -> str:
    key, t = draw(st.sampled_from(FIELDS))
    value = draw(st.one_of(_typed(t), _typed(t), any_value))
    prefix = draw(st.sampled_from(["", "", "", "", "+", "++", "~"]))
    return f"~{key}" if prefix == "~" and draw(st.booleans()) else f"{prefix}{key}={value}"


@st.composite
def override(draw: Any) -> str:
    kind = draw(st.sampled_from(["field", "field", "field", "field", "unknown_key", "group"]))
    if kind == "field":
        return _field_override(draw)
    if kind == "unknown_key":
        group = draw(st.sampled_from([*GROUPS, ""]))
        name = draw(st.sampled_from(["nope", "windw_s", "sm_clock", "Backend", "a.b", "ü"]))
        return (f"{draw(st.sampled_from(['', '+']))}{group + '.' if group else ''}"
                f"{name}={draw(any_value)}")
    group = draw(st.sampled_from(list(OPTIONS)))
    option = draw(st.one_of(
        st.sampled_from(OPTIONS[group]),
        st.sampled_from(["nope", "a100", "../device/sim", "", "x y"]),
    ))
    return f"{group}={option}"


# --- the validation path ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim_a100(tmp_path_factory):
    """One simulated A100, opened once: the device every request is checked against."""
    from orchestrator.devices import open_backend

    state = tmp_path_factory.mktemp("hardening") / "sim"
    saved = os.environ.get("DVFS_SIM_STATE_DIR")
    backend = open_backend({"backend": "sim", "state_dir": str(state)})
    device = backend.device(0)
    yield device, state
    backend.close()
    if saved is None:
        os.environ.pop("DVFS_SIM_STATE_DIR", None)
    else:
        os.environ["DVFS_SIM_STATE_DIR"] = saved


def check_overrides(overrides: list[str], device: Any) -> UserError | None:
    """What a sweep's job does before touching a device; the UserError it refuses with, or None.

    Hydra and OmegaConf errors are converted as ``dvfs sweep`` converts them (``run_sweep``); any
    other exception escapes, and fails the test.
    """
    from orchestrator.jobs.job import JobSpec
    from orchestrator.jobs.policy import Policy

    try:
        cfg = C.compose(overrides)
        spec = JobSpec.from_config(cfg)  # validates, inject spec included
        Policy().check(spec.request, device.capabilities(), device.identity.name)
    except UserError as e:
        return e
    except Exception as e:  # noqa: BLE001 - the same conversion as the CLI, else re-raised
        err = hydra_user_error(e)
        if err is None:
            raise
        return err
    assert_valid(cfg, spec.resolved, spec.request)
    assert spec.store_dir is None or spec.store_dir.is_absolute()
    return None


def assert_valid(cfg: Any, resolved: dict[str, Any], request: Any) -> None:
    """An accepted config holds only values a trial can run with."""
    m, d = cfg.measure, cfg.device
    assert d.backend in C.BACKENDS and m.meter in C.METERS and cfg.objective in C.OBJECTIVES
    for key in ("window_s", "poll_hz", "timeout_s", "settle_s", "clock_tolerance_mhz",
                "counter_edge_wait_s"):
        value = getattr(m, key)
        assert isinstance(value, (int, float)) and math.isfinite(value) and value >= 0, (key, value)
    for key in ("min_iters", "max_iters", "repeats", "warmup_iters", "reference_samples",
                "min_counter_updates"):
        assert isinstance(getattr(m, key), int) and getattr(m, key) >= 0, key
    assert m.window_s > 0 and m.min_iters >= 1 and m.repeats >= 1 and m.min_iters <= m.max_iters
    assert m.reference_samples <= 64 and m.repeats <= 1000
    # What a user would accept, stated here apart from the schema's table: no trial holds a
    # setting for more than a day, nothing counts past a billion.
    assert m.window_s <= 3600 and m.settle_s <= 600 and m.timeout_s <= 86_400
    assert m.repeats * (2 * m.window_s + m.counter_edge_wait_s) + m.settle_s <= 1000 * 7260
    assert max(m.min_iters, m.max_iters, m.check_iters or 0, m.min_counter_updates) <= 10**9
    assert 0 <= cfg.seed < 2**32 and 0 <= d.seed < 2**32
    for prefix, node, schema in (("", cfg, C.DvfsConfig), ("device.", d, C.DeviceConfig),
                                 ("measure.", m, C.MeasureConfig)):
        for name, bound in bounds(schema).items():
            value = getattr(node, name)
            assert value is None or bound.admits(value), (prefix + name, value)
    for key in C.PATH_KEYS:
        value = OmegaConf.select(cfg, key)
        assert value is None or (str(value).strip() and str(value).lower() not in ("true", "false")
                                 and str(value) not in C.group_options()), (key, value)
    assert d.count >= 1 and (d.backend != "sim" or d.count <= 64)
    period = d.energy_update_period_s  # None: the simulated profile's own
    assert period is None or (math.isfinite(period) and period >= 0)
    assert m.digest in C.DIGESTS
    assert math.isfinite(m.counter_edge_wait_s) and m.counter_edge_wait_s >= 0
    assert m.check_iters is None or 1 <= m.check_iters <= m.max_iters
    assert isinstance(cfg.seed, int) and cfg.seed >= 0
    if request.sm_clock_mhz is not None:
        assert all(isinstance(v, int) for v in request.sm_clock_mhz)
    if request.power_limit_w is not None:
        assert math.isfinite(request.power_limit_w)
    json.dumps(resolved)  # what the store and the trial key need


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(overrides=st.lists(override(), min_size=1, max_size=4))
@pytest.mark.slow
def test_any_override_is_accepted_and_valid_or_refused_in_one_line(sim_a100, overrides):
    device, state = sim_a100
    before = sorted((p.name, p.read_bytes()) for p in state.glob("gpu-*.state"))
    error = check_overrides(overrides, device)
    if error is not None:
        text = str(error)
        assert text and "\n" not in text, (overrides, text)
        assert "Traceback" not in text
    assert sorted((p.name, p.read_bytes()) for p in state.glob("gpu-*.state")) == before
    assert not list((state / "journal").glob("*.json"))


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["measure.window_s=nan"], "measure.window_s=nan must be greater than 0 and at most 3600"),
        # the three a user's typos ran (issue #31): a window of 31,000 years, 2,025 repeats, a
        # results folder named True
        (["measure.window_s=999999999999"], "measure.window_s=999999999999 must be greater than"),
        (["measure.repeats=${now:%Y}"], "must be between 1 and 1000"),
        (["store_dir=true"], "store_dir=True is a boolean, not a path"),
        (["store_dir=''"], "store_dir='' is empty"),
        (["store_dir=quick"], "did you mean measure=quick?"),
        (["device.journal_dir=gemm"], "did you mean workload=gemm?"),
        (["measure.timeout_s=1e9"], "at most 86400 s"),
        (["device.sm_clock_mhz=[1400,300]"], "the lower clock comes first"),
        (["device.sm_clock_mhz=inf"], "device.sm_clock_mhz=inf"),
        (["device.sm_clock_mhz=[1200.5,1300]"], "whole number"),
        (["measure.reference_samples=100000"],
         "measure.reference_samples=100000 must be between 0 and 64"),
        (["device.energy_update_period_s=-1"],
         "device.energy_update_period_s=-1 must be between 0 and 10 s"),
        (["device.count=100"], "device.count=100"),
        (["seed=-1"], "seed=-1 must be between 0 and 4294967295"),
        (["device.gpus=[1.5]"], "device.gpus"),
        (["device.planted_thresholds={0: {gemm: fast}}"], "device.planted_thresholds"),
    ],
)
def test_values_hypothesis_found_are_refused_with_a_reason(sim_a100, overrides, words):
    error = check_overrides(overrides, sim_a100[0])
    assert error is not None and words in str(error), error


# --- the same through `dvfs sweep` --------------------------------------------------------------
@pytest.mark.parametrize(
    "override_",
    [
        "device.sm_clock_mhz=inf",
        "measure.window_s=nan",
        "device.count=100",
        "device.energy_update_period_s=-1",
        "device.policy_file=/",
        "device.profile='a b'",
        "measure.meter=${oops}",
        "+device.nope=1",
        "~measure.window_s",
        "workload.name='日本'",
        "measure.window_s=999999999999",
        "measure.repeats=${now:%Y}",
        "store_dir=true",
        "store_dir=''",
        "store_dir=quick",
    ],
)
@pytest.mark.slow
def test_bad_input_through_dvfs_sweep_is_exit_2_one_line_no_traceback(tmp_path, override_):
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(tmp_path / "sim"))
    out = subprocess.run(
        [*DVFS, "sweep", "workload.size=tiny", f"hydra.run.dir={tmp_path / 'run'}", override_],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "run" / "trials.sqlite").exists()
    journal = tmp_path / "sim" / "journal"
    assert not journal.exists() or not list(journal.glob("*.json"))
