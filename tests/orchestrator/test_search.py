"""The stability search as a state machine, against the simulated GPU's own fault model.

No Hydra, no kernels: a trial is ``k`` iterations, each faulting with the probability the sim's
model gives at that clock for the planted (or seeded) threshold.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.devices.base import DeviceCapabilities, KernelWork
from orchestrator.devices.sim import model
from orchestrator.devices.sim.profile import load_profile
from orchestrator.errors import UserError
from orchestrator.jobs.policy import Policy
from orchestrator.jobs.request import SettingsRequest
from orchestrator.results.rows import Outcome, outcome_of
from orchestrator.search import (
    SETTINGS,
    SearchOptions,
    ThresholdSearch,
    coarse_indices,
    run_search,
    search_values,
)

A100 = load_profile("a100_sxm4_40gb")
CLOCKS = A100.sm_clocks_mhz  # 210..1410 in 15 MHz steps: 81 values
N_CLEAN = 300


def sim_trial(threshold, rng, iterations=(30, 80), law=None):
    """A trial on the sim: ``k`` calls, each faulted with the model's probability."""
    law = law or (lambda f: model.fault_probability(A100, f, threshold))

    def trial(probe):
        k = max(int(rng.integers(*iterations)), probe.min_iterations or 0)
        p = law(probe.value)
        crash, corrupt = (p.crash, p.corrupt) if hasattr(p, "crash") else (0.0, p)
        if rng.random() < 1 - (1 - crash) ** k:
            return Outcome(False, int(rng.integers(0, k)), "crash", "simulated crash")
        if rng.random() < 1 - (1 - corrupt) ** k:
            return Outcome(False, k, "wrong", "rel error 3e-2")
        return Outcome(True, k, "ok")

    return trial


def planted_rate(threshold, f):
    return model.fault_probability(A100, f, threshold).any


def test_coarse_points_span_the_range_both_ends_included():
    assert coarse_indices(81, 8) == [0, 11, 23, 34, 46, 57, 69, 80]
    assert coarse_indices(3, 8) == [0, 1, 2] and coarse_indices(1, 8) == [0]


@pytest.mark.parametrize("seed", range(20))
def test_the_search_finds_the_seeded_threshold_within_one_step_in_a_third_of_a_grid(seed):
    uuid = f"GPU-seed-{seed:04d}"
    threshold = model.stability_threshold_mhz(A100, uuid, "gemm")
    rng = np.random.default_rng(seed)
    r = run_search(ThresholdSearch(CLOCKS, N_CLEAN), sim_trial(threshold, rng))
    assert r.confirmed and r.stable_value == threshold
    assert r.failing_value == threshold - 15 and r.steps_between == 1  # one supported step
    assert r.iterations_at_stable >= N_CLEAN
    assert r.fault_rate_bound == pytest.approx(3 / r.iterations_at_stable)
    assert r.trials_used <= len(CLOCKS) / 3, r
    assert planted_rate(threshold, r.stable_value) < 10 / N_CLEAN
    assert not r.non_monotone


def soft_law(threshold):
    """A harder device than the sim's: the fault rate creeps up slowly below the threshold,
    from 0.2 % one step down, doubling every step, so several values sit near 10/n."""
    return lambda f: 0.0 if f >= threshold else min(1.0, 0.002 * 2 ** ((threshold - f) / 15 - 1))


def test_across_20_seeds_no_value_with_a_fault_rate_of_10_per_n_is_declared_stable():
    declared = []
    for seed in range(20):
        rng = np.random.default_rng(1000 + seed)
        threshold = int(rng.choice(CLOCKS[20:70]))
        law = soft_law(threshold)
        r = run_search(ThresholdSearch(CLOCKS, N_CLEAN), sim_trial(threshold, rng, law=law))
        assert r.confirmed
        declared.append(law(r.stable_value))
        assert law(r.stable_value) < 10 / N_CLEAN, (seed, threshold, r)
        # and the sim's own law for the same threshold, on the same seed
        rng = np.random.default_rng(seed)
        r = run_search(ThresholdSearch(CLOCKS, N_CLEAN), sim_trial(threshold, rng))
        assert planted_rate(threshold, r.stable_value) < 10 / N_CLEAN
    assert max(declared) < 10 / N_CLEAN


def test_a_failure_in_confirmation_moves_the_candidate_up():
    # The value just above the failures passes its probe and then fails during confirmation.
    values = list(range(10))
    script = {0: [False], 9: [True], 1: [False], 2: [True, True, False], 3: [True] * 10}
    calls = {v: 0 for v in values}
    for v in values:
        script.setdefault(v, [False] if v < 2 else [True] * 10)

    def trial(p):
        i = calls[p.value]
        calls[p.value] += 1
        ok = script[p.value][min(i, len(script[p.value]) - 1)]
        return Outcome(ok, 100, "ok" if ok else "wrong")

    r = run_search(ThresholdSearch(values, 250, coarse_points=2, confirm_trials=1), trial)
    assert r.stable_value == 3 and r.failing_value == 2 and r.confirmed
    assert r.failures_at_failing == 1 and r.trials_at_failing == 3
    assert not r.non_monotone


def test_a_failure_above_a_pass_is_reported_not_hidden():
    values = list(range(8))  # coarse probes every value: 7 6 5 4 3 2 1 0
    fails = {5, 1, 0}  # passes at 2..4 below the failure at 5

    r = run_search(ThresholdSearch(values, 50, coarse_points=8),
                   lambda p: Outcome(p.value not in fails, 60,
                                     "wrong" if p.value in fails else "ok"))
    assert r.non_monotone and r.failing_value == 5 and r.lowest_passing_value == 2
    assert r.stable_value == 6  # the stable range starts above the safest failure
    assert "non-monotone: a failure at 5 is safer than a pass at 2" in r.note


def test_no_failure_at_all_confirms_the_riskiest_value_and_says_so():
    r = run_search(ThresholdSearch(CLOCKS, 100), lambda p: Outcome(True, 60, "ok"))
    assert r.stable_value == 210 and r.failing_value is None and r.trials_used == 8 + 1
    assert "no failure seen down to 210" in r.note


def test_a_failure_at_the_safest_value_declares_nothing_stable():
    r = run_search(ThresholdSearch(CLOCKS, 100), lambda p: Outcome(False, 60, "wrong"))
    assert r.stable_value is None and r.failing_value == 1410 and not r.confirmed
    assert r.trials_used == 8 and "fails at the safest value" in r.note


def test_invalid_passes_are_retried_then_given_up():
    def trial(p):  # every pass at 1410 is invalid; everything else fails
        if p.value == 1410:
            return Outcome(None, 60, "ok", "invalid: clock did not lock")
        return Outcome(False, 60, "wrong")

    r = run_search(ThresholdSearch(CLOCKS, 100, max_inconclusive=2), trial)
    assert r.stable_value is None and r.candidate_value is None
    assert "no valid passing trial" in r.note and "clock did not lock" in r.note


def test_the_search_refuses_to_propose_before_the_last_batch_is_recorded():
    s = ThresholdSearch(CLOCKS, 100)
    s.propose()
    with pytest.raises(RuntimeError):
        s.propose()


def test_outcome_of_rows():
    ok = {"status": "ok", "valid": True, "iterations": 40}
    assert outcome_of([ok, ok]) == Outcome(True, 80, "ok")
    bad = {"status": "wrong", "valid": True, "iterations": 40, "error": "rel error 3e-2\nmore"}
    assert outcome_of([ok, bad]) == Outcome(False, 80, "wrong", "rel error 3e-2")
    inv = dict(ok, valid=False, invalid_reason="clock did not lock")
    assert outcome_of([inv]).passed is None and outcome_of([]).passed is None


def test_a_device_error_is_no_evidence_about_the_setting():
    """A lost GPU at a value is inconclusive (retried), never the value's failure."""
    lost = {"status": "device_error", "valid": False, "iterations": 0, "error": "GPU lost (XID 79)"}
    outcome = outcome_of([lost])
    assert outcome.passed is None and outcome.status == "device_error"
    lost_once: set[float] = set()

    def trial(p):  # the threshold is at 3; the first trial at 5 loses its GPU
        if p.value == 5 and 5 not in lost_once:
            lost_once.add(5)
            return outcome_of([lost])
        ok = p.value >= 3
        return Outcome(ok, 100, "ok" if ok else "wrong")

    r = run_search(ThresholdSearch(list(range(8)), 200, coarse_points=8, confirm_trials=1), trial)
    assert r.stable_value == 3 and r.failing_value == 2 and not r.non_monotone
    assert r.failure_statuses == "wrong×1" and "device_error" not in (r.note or "")


def test_a_not_measured_trial_is_retried_and_never_fails_its_value():
    """A worker killed from outside at a value measured nothing: the search asks again."""
    killed = {"status": "not_measured", "valid": False, "iterations": 0,
              "error": "the worker process died; not measured"}
    asked: list[float] = []

    def trial(p):  # the threshold is at 3; the first trial at every value measures nothing
        asked.append(p.value)
        if asked.count(p.value) == 1:
            return outcome_of([killed])
        ok = p.value >= 3
        return Outcome(ok, 100, "ok" if ok else "wrong")

    r = run_search(ThresholdSearch(list(range(8)), 200, coarse_points=8, confirm_trials=1), trial)
    assert r.stable_value == 3 and r.failing_value == 2
    assert "not_measured" not in (r.failure_statuses or "")
    assert asked.count(3) >= 2  # asked again after the trial that measured nothing


# --- the search space -------------------------------------------------------------------------
CAPS = DeviceCapabilities(
    mem_clocks_mhz=(1215,), sm_clocks_mhz={1215: tuple(reversed(CLOCKS))}, power_limit_min_w=100,
    power_limit_max_w=400, power_limit_default_w=400, clock_offset_range_mhz=(-200, 1000),
    has_energy_counter=True,
)


def check(policy=Policy()):
    return lambda req: policy.check(req, CAPS, "NVIDIA A100-SXM4-40GB")


def test_the_space_is_the_devices_own_values_riskiest_first():
    sm = search_values(SETTINGS["device.sm_clock_mhz"], CAPS, check(), SettingsRequest())
    assert sm == CLOCKS and len(sm) == 81
    power = search_values(SETTINGS["device.power_limit_w"], CAPS, check(), SettingsRequest())
    assert power[0] == 100 and power[-1] == 400 and len(power) == 31
    offsets = search_values(SETTINGS["device.clock_offset_mhz"], CAPS, check(), SettingsRequest())
    assert offsets[0] == 1000 and offsets[-1] == 0  # upward: the highest offset is the riskiest
    narrow = check(Policy(sm_clock_range_mhz=(900, 1410)))
    narrowed = search_values(SETTINGS["device.sm_clock_mhz"], CAPS, narrow, SettingsRequest())
    assert narrowed[0] == 900


def test_an_unsupported_explicit_value_is_a_user_error():
    with pytest.raises(UserError, match="SM clock 1007 MHz is not supported"):
        search_values(SETTINGS["device.sm_clock_mhz"], CAPS, check(), SettingsRequest(),
                      explicit=[1005, 1007])


def test_a_device_without_offsets_refuses_an_offset_search():
    caps = DeviceCapabilities((1215,), {1215: CLOCKS}, 100, 400, 400, None, True)
    with pytest.raises(UserError, match="does not support clock offsets"):
        search_values(SETTINGS["device.clock_offset_mhz"], caps,
                      lambda r: Policy().check(r, caps, "P100"), SettingsRequest())


@pytest.mark.parametrize(
    "options, message",
    [
        (SearchOptions(setting="workload"),
         "hydra.sweeper.setting=workload is not an ordered setting"),
        (SearchOptions(confirm_iterations=0),
         "hydra.sweeper.confirm_iterations=0 must be between 1 and"),
        (SearchOptions(coarse_points=1), "coarse_points=1 must be between 2 and 1000"),
        (SearchOptions(step=-5.0), "step=-5 must be greater than 0 and at most"),
    ],
)
def test_bad_options_are_one_line_user_errors(options, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        options.validated()
    assert "\n" not in str(e.value)


def test_the_search_against_two_simulated_gpus_with_planted_thresholds(tmp_path, monkeypatch):
    """The same search over the simulated NVML (a real device's clock lock and fault draws)."""
    from orchestrator.devices import open_backend

    monkeypatch.setenv("DVFS_SIM_STATE_DIR", str(tmp_path / "sim"))
    planted = {"0": {"gemm": 1065}, "1": {"gemm": 840}}
    backend = open_backend({"backend": "sim", "count": 2, "planted_thresholds": planted})
    work = KernelWork(flops=2 * 4096**3, bytes_moved=3 * 4 * 4096**2, peak="fp32",
                      kernel_class="gemm", framework="jax")
    try:
        for device, want in zip(backend.devices(), (1065, 840)):
            def trial(probe, device=device):
                device.set_locked_sm_clocks(int(probe.value), int(probe.value))
                faults = [device.on_kernel_call(work) for _ in range(40)]
                device.reset_locked_sm_clocks()
                bad = [f for f in faults if f.value != "none"]
                return Outcome(not bad, 40, bad[0].value if bad else "ok")

            r = run_search(ThresholdSearch(CLOCKS, 200), trial)
            assert (r.stable_value, r.failing_value) == (want, want - 15)
            assert r.trials_used <= math.ceil(len(CLOCKS) / 3)
    finally:
        backend.close()
