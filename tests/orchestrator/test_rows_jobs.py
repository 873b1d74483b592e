"""The trial pipeline's shared rules: the typed job, its keys, resume, what rows tell a sweeper."""

from __future__ import annotations

import importlib.metadata as md
import pickle

import pytest
from omegaconf import OmegaConf

from orchestrator.config import compose
from orchestrator.devices.base import DeviceIdentity
from orchestrator.errors import UserError
from orchestrator.jobs.job import (
    PER_JOB_KEYS,
    JobSpec,
    machine_key,
    record_sweep,
    sweep_id_for,
    trial_key,
)
from orchestrator.launching.resume import resume_of, resume_trials
from orchestrator.results.rows import (
    JobResult,
    Outcome,
    Status,
    TrialRow,
    failed_by,
    fails_setting,
    failure_rows,
    outcome_of,
)
from orchestrator.results.store import ResultStore

IDENTITY = DeviceIdentity(
    index=0, uuid="GPU-00000000-test", name="NVIDIA A100-SXM4-40GB", pci_bus_id="00000000:07:00.0",
    driver_version="555.42", backend="sim", architecture="ampere",
)

SHIPPED = [
    [],
    ["experiment=quickstart"],
    ["experiment=seed_claims"],
    ["workload=stencil", "framework=tensorflow", "framework.xla=true", "device.sm_clock_mhz=1065"],
    ["device.sm_clock_mhz=[900,1200]", "device.gpus=[0]", "device.power_limit_w=250"],
    ["workload=mlp_train", "workload.dtype=bfloat16", "measure.repeats=3"],
]


@pytest.mark.parametrize("overrides", SHIPPED, ids=lambda o: " ".join(o) or "defaults")
def test_the_typed_job_resolves_to_exactly_what_hydra_composed(overrides):
    # Stores written before JobSpec hashed OmegaConf's own resolution: the keys must not move.
    cfg = compose(overrides)
    job = JobSpec.from_config(cfg, "/tmp/multirun/2026-12-03/10-00-00")
    composed = OmegaConf.to_container(cfg, resolve=True)
    assert job.resolved == composed
    assert job.trial_key(IDENTITY.uuid) == trial_key(composed, IDENTITY.uuid)
    assert job.sweep_id == "2026-12-03/10-00-00"
    again = pickle.loads(pickle.dumps(job))  # what a Ray actor receives
    assert again.resolved == job.resolved and again.label == job.label


def test_a_job_setting_store_dir_keeps_it_and_a_bad_job_is_one_user_error(tmp_path):
    job = JobSpec.from_config(compose([f"store_dir={tmp_path / 'a' / 'b'}"]), "/elsewhere")
    assert job.store_dir == tmp_path / "a" / "b" and job.sweep_id == "a/b"
    with pytest.raises(UserError, match="size preset .huge."):
        JobSpec.from_config(compose(["workload=gemm", "workload.size=huge"]))
    with pytest.raises(UserError, match="inject"):
        JobSpec.from_config(compose(["device=nvml", "+device.inject={kind: crash}"]))


def test_the_label_names_the_computation_and_the_setting():
    job = JobSpec.from_config(compose(["workload=stencil", "device.sm_clock_mhz=1065"]))
    assert job.label == "stencil/jax float32 [sm=1065 MHz]"


def test_the_machine_key_ignores_what_a_job_sets_and_where_it_runs():
    base = OmegaConf.to_container(compose([]).device, resolve=True)
    assert set(PER_JOB_KEYS) >= {"sm_clock_mhz", "power_limit_w", "inject", "gpus"}
    varied = dict(base, sm_clock_mhz=1065, power_limit_w=200, gpus=[1], inject={"kind": "crash"})
    assert machine_key(varied) == machine_key(base)
    assert machine_key(dict(base, count=4)) != machine_key(base)


def test_resume_finds_a_trial_only_when_every_repeat_is_stored(tmp_path):
    job = JobSpec.from_config(compose(["measure.repeats=2"]), tmp_path)
    key = job.trial_key(IDENTITY.uuid)
    with ResultStore(tmp_path) as store:
        record_sweep(store, job)
        record_sweep(store, job)  # once: the first job's config stays
        assert store.get_meta("sweep")["config"] == job.resolved
        rows = failure_rows(job, IDENTITY, Status.CRASH, "boom", sweep_id=job.sweep_id)
        store.put(rows[0])
        half = resume_trials(store, [key], job.repeats)[key]
        assert half.run and half.attempt == 2 and half.rows is None  # again, as a new attempt
        store.put(rows[1])
        whole = resume_trials(store, [key, "no-such-key"], job.repeats)
        assert not whole[key].run and [r["repeat"] for r in whole[key].rows] == [0, 1]
        assert whole["no-such-key"].run and whole["no-such-key"].attempt == 1


def _attempt(status: str, attempt: int, repeats: int = 2) -> list[dict]:
    return [{"repeat": r, "attempt": attempt, "status": status} for r in range(repeats)]


@pytest.mark.parametrize(
    "stored, retry, runs",
    [
        (_attempt("not_measured", 1), "not_measured", True),  # measured nothing: again
        (_attempt("not_measured", 1), "never", False),
        (_attempt("crash", 1), "not_measured", False),  # the setting's failure is a result
        (_attempt("crash", 1), "failed", True),
        (_attempt("ok", 1), "failed", False),
        (_attempt("not_measured", 1) + _attempt("ok", 2), "not_measured", False),  # done since
        (_attempt("ok", 1) + _attempt("not_measured", 2), "not_measured", True),  # the latest
    ],
)
def test_the_retry_policy_runs_again_only_what_its_latest_attempt_leaves_open(stored, retry, runs):
    resume = resume_of(stored, repeats=2, retry=retry)
    latest = max(r["attempt"] for r in stored)
    assert resume.run is runs and resume.attempt == latest + 1
    assert [r["attempt"] for r in resume.rows] == [latest, latest]


def test_rows_stored_before_attempts_existed_are_a_first_attempt():
    resume = resume_of([{"repeat": 0, "status": "not_measured"}], repeats=1, retry="not_measured")
    assert resume.run and resume.attempt == 2


def test_every_status_says_who_failed():
    assert {s.value: failed_by(s) for s in Status} == {
        "ok": None, "wrong": "setting", "nondeterministic": "setting", "crash": "setting",
        "timeout": "setting", "device_error": "device", "not_measured": "circumstances",
        "interrupted": "circumstances", "out_of_memory": "memory",
    }


def test_a_not_measured_trial_is_no_evidence_about_its_setting():
    rows = failure_rows(JobSpec.from_config(compose([])), IDENTITY, Status.NOT_MEASURED,
                        "not run: lost", sweep_id="s", attempt=3)
    assert {(r["status"], r["failed_by"], r["attempt"]) for r in rows} == {
        ("not_measured", "circumstances", 3)}
    outcome = outcome_of(rows)
    assert outcome.passed is None and outcome.status == "not_measured"
    assert not fails_setting(rows[0]["status"])


def test_failure_rows_have_every_column_of_a_measured_row():
    job = JobSpec.from_config(compose(["measure.repeats=3"]))
    rows = failure_rows(job, IDENTITY, Status.TIMEOUT, "no result", sweep_id="s/1", host="node7")
    assert [r["repeat"] for r in rows] == [0, 1, 2]
    assert all(set(r) == set(TrialRow.__dataclass_fields__) for r in rows)
    assert {(r["status"], r["error"], r["host"], r["valid"]) for r in rows} == {
        ("timeout", "no result", "node7", False)
    }
    assert rows[0]["versions"]["dvfs-orchestrator"] == md.version("dvfs-orchestrator")


def _row(status, valid=True, iters=10, error=None, key="k"):
    return {"status": status, "valid": valid, "iterations": iters, "checked_iters": iters,
            "error": error, "trial_key": key, "time_per_iter_s": 0.01, "energy_per_iter_j": 2.0,
            "invalid_reason": None if valid else "clock did not lock"}


def test_a_device_error_is_no_evidence_about_the_setting_and_a_crash_is():
    assert [fails_setting(s) for s in Status] == [False, True, True, True, True, False, False,
                                                  False, False]
    assert not fails_setting(None)
    assert outcome_of([_row("device_error", error="GPU lost\nmore")]) == Outcome(
        None, 10, "device_error", "GPU lost"
    )
    assert outcome_of([_row("ok"), _row("crash", error="segfault")]).passed is False
    assert outcome_of([_row("ok", valid=False)]).passed is None
    assert outcome_of([_row("ok"), _row("ok")]) == Outcome(True, 20, "ok")
    assert outcome_of([]).status == "missing"


def test_a_job_result_is_a_float_to_any_sweeper_and_keeps_its_outcome():
    result = JobResult.of([_row("ok", key="a"), _row("ok", key="a")], "energy_per_work")
    assert result == 2.0 and result + 1 == 3.0 and result.trial_keys == ("a",)
    assert result.outcome.passed is True
    again = pickle.loads(pickle.dumps(result))
    assert (float(again), again.outcome, again.trial_keys) == (2.0, result.outcome, ("a",))
    failed = JobResult.of([_row("wrong", key="b")], "energy_per_work")
    both = JobResult.combine([result, failed])
    assert both == float("inf") and both.outcome.passed is False and both.trial_keys == ("a", "b")
    assert both.outcome.iterations == 30
    assert JobResult.missing() == float("inf") and JobResult.missing().outcome.passed is None


def test_the_sweep_id_is_the_last_two_parts_of_the_store_dir(tmp_path):
    assert sweep_id_for(tmp_path / "multirun" / "x" / "y") == "x/y"


def test_the_versions_read_once_per_process_are_a_fresh_copy_for_each_row():
    from orchestrator.results.provenance import library_versions

    first = library_versions()
    assert first["numpy"] == md.version("numpy") and first["ray"] == md.version("ray")
    first["numpy"] = "edited by one row"
    assert library_versions()["numpy"] == md.version("numpy")
