"""The sweep composer gives every job exactly what Hydra's full composition gives.

The reference is Hydra's own ``ConfigLoader.load_sweep_config`` over the real ``conf/`` tree, per
job; the composer under test shares its caches across the jobs of a batch, as in a sweep. Compared:
the job's resolved config (what is measured and stored), where its rows go and its sweep id, and
for a job Hydra refuses, that the composer refuses it too, as a ``UserError``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config import CONF_DIR, DvfsConfig, register_configs
from orchestrator.errors import UserError
from orchestrator.jobs.job import JobSpec, trial_key
from orchestrator.launching.compose import SweepComposer, changed_paths, replace_path


@pytest.fixture(scope="module")
def hydra_loader():
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield GlobalHydra.instance().hydra.config_loader


def master(loader, *hydra_overrides: str):
    """The sweep's config as ``hydra.multirun`` makes it: only ``hydra.*`` overrides carry over to
    the jobs (the sweeper hands every other override to each job)."""
    from hydra.types import RunMode

    return loader.load_configuration(
        "config", overrides=["hydra.sweep.dir=/tmp/dvfs-compose-test", *hydra_overrides],
        run_mode=RunMode.MULTIRUN,
    )


def reference(composer: SweepComposer, overrides: list[str], num: int) -> JobSpec | str:
    """Hydra's full composition of one job, validated; or the message of its refusal."""
    try:
        sweep_config, task = composer.full(overrides, num)
        return JobSpec.from_config(task, default_store_dir=str(sweep_config.hydra.sweep.dir))
    except UserError as e:
        return f"refused: {e}"


def assert_same(composer: SweepComposer, jobs: list[list[str]]) -> None:
    for num, overrides in enumerate(jobs):
        want = reference(composer, overrides, num)
        if isinstance(want, str):
            with pytest.raises(UserError):
                composer.spec(overrides, num)
            continue
        got = composer.spec(overrides, num)
        assert got.resolved == want.resolved, (overrides, changed_paths(got.resolved,
                                                                        want.resolved))
        assert (got.store_dir, got.sweep_id) == (want.store_dir, want.sweep_id), overrides
        assert got.trial_key("GPU-x") == want.trial_key("GPU-x") == trial_key(want.resolved,
                                                                              "GPU-x")


def grid(*axes: list[str]) -> list[list[str]]:
    jobs: list[list[str]] = [[]]
    for axis in axes:
        jobs = [[*j, v] for j in jobs for v in axis]
    return jobs


def all_pairs(*axes: list[str]) -> list[list[str]]:
    """Jobs of the grid in which every two values of two axes meet at least once (picked greedily,
    in grid order): what one override does to another is composed, at a fraction of the grid."""
    missing = {(a, x, b, y) for a in range(len(axes)) for b in range(a + 1, len(axes))
               for x in axes[a] for y in axes[b]}

    def pairs(job: list[str]) -> set[tuple[int, str, int, str]]:
        return {(a, job[a], b, job[b]) for a in range(len(job)) for b in range(a + 1, len(job))}

    jobs = []
    candidates = grid(*axes)
    while missing:
        best = max(candidates, key=lambda job: len(pairs(job) & missing))
        jobs.append(best)
        missing -= pairs(best)
    return jobs


def test_all_pairs_meets_every_pair_of_values_in_fewer_jobs_than_the_grid():
    axes = [["a1", "a2", "a3"], ["b1", "b2"], ["c1", "c2", "c3"], ["d1", "d2"]]
    jobs = all_pairs(*axes)
    for a in range(4):
        for b in range(a + 1, 4):
            assert {(j[a], j[b]) for j in jobs} == {(x, y) for x in axes[a] for y in axes[b]}
    assert 9 <= len(jobs) <= 12 < len(grid(*axes)) == 36


@pytest.mark.parametrize("experiment", ["quickstart", "seed_claims", "optuna_energy", "seed_models",
                                        None])
@pytest.mark.slow
def test_the_shipped_experiments_compose_as_hydra_composes_them(hydra_loader, experiment):
    common = [f"experiment={experiment}"] if experiment else []
    composer = SweepComposer(master(hydra_loader), hydra_loader)
    jobs = all_pairs(
        ["workload=gemm", "workload=stencil", "workload=selu"],
        ["framework=jax", "framework=tensorflow"],
        ["device.sm_clock_mhz=null", "device.sm_clock_mhz=510", "device.sm_clock_mhz=[510,1410]"],
        ["device.power_limit_w=150", "seed=3"],
    )
    assert_same(composer, [[*common, *j] for j in jobs])


def test_a_grid_over_values_composes_from_one_base(hydra_loader):
    composer = SweepComposer(master(hydra_loader), hydra_loader)
    jobs = grid(["workload.size=tiny"], [f"device.sm_clock_mhz={c}" for c in range(510, 1411, 300)],
                [f"seed={s}" for s in range(3)], ["workload=gemm"])
    composer.check_values(jobs)
    assert_same(composer, jobs)
    assert len(composer._bases) == 1  # noqa: SLF001 - one Hydra composition for the whole grid


def test_interpolations_between_swept_keys_are_composed_in_full(hydra_loader):
    # settle_s reads the swept window: neither patch alone can be put in place of the other's key.
    composer = SweepComposer(master(hydra_loader), hydra_loader)
    line = "measure.settle_s=${measure.window_s}"
    jobs = grid([line], ["measure.window_s=0.5", "measure.window_s=2.0"])
    assert_same(composer, jobs)
    assert composer.patch((), line).entangled
    assert not composer.patch((), "measure.window_s=2.0").entangled


def test_a_config_that_reads_the_job_number_is_composed_in_full(hydra_loader):
    composer = SweepComposer(master(hydra_loader), hydra_loader)
    line = "store_dir=/tmp/s/${hydra:job.num}"
    jobs = [[line, "seed=1"], [line, "seed=2"]]
    assert composer.patch((), line).entangled
    assert [str(composer.spec(j, n).store_dir) for n, j in enumerate(jobs)] == ["/tmp/s/0",
                                                                              "/tmp/s/1"]
    assert_same(composer, jobs)


def test_a_sweep_dir_that_reads_the_job_is_composed_in_full(hydra_loader):
    composer = SweepComposer(
        master(hydra_loader, "hydra.sweep.dir=/tmp/s/${hydra.job.override_dirname}"), hydra_loader
    )
    assert composer.base(()).per_job
    assert_same(composer, [["seed=1"], ["seed=2"]])


def test_a_users_workload_target_is_a_base_of_its_own(hydra_loader, monkeypatch):
    """``workload.target`` chooses the workload as a group choice does: a base per target,
    composed once; ``workload=custom`` alone is no valid job, so a base without the target
    composes each of its jobs in full (and refuses them as Hydra's composition does)."""
    from pathlib import Path

    from kernels.registry import WORKLOAD_PATH_ENV

    monkeypatch.setenv(WORKLOAD_PATH_ENV, str(Path(__file__).resolve().parents[2]))
    composer = SweepComposer(master(hydra_loader), hydra_loader)
    target = "workload.target=examples.attention:make_workload"
    jobs = grid(["workload=custom"], [target], ["framework=jax", "framework=tensorflow"],
                [f"device.sm_clock_mhz={c}" for c in (1110, 1410)])
    composer.check_values(jobs)
    assert_same(composer, jobs)
    assert not composer.base(("workload=custom", target)).per_job
    assert composer.base(("workload=custom",)).per_job  # no target: no valid job alone
    with pytest.raises(UserError, match="needs workload.target"):
        composer.spec(["workload=custom", "seed=1"])
    assert_same(composer, [["workload=custom", "seed=1"], ["workload=custom", target, "seed=2"]])


def test_check_values_names_the_bad_value_before_anything_runs(hydra_loader):
    composer = SweepComposer(master(hydra_loader), hydra_loader)
    jobs = grid(["seed=1", "seed=2"], ["measure.repeats=1", "measure.repeats=0"])
    with pytest.raises(UserError, match="measure.repeats"):
        composer.check_values(jobs)
    with pytest.raises(UserError, match="workload"):
        composer.check_values([["workload=nope"]])


def test_a_combination_of_good_values_is_refused_when_its_job_is_made(hydra_loader):
    # tf32 is a precision of the GEMM, not of the Hessian: each value passes check_values alone.
    composer = SweepComposer(master(hydra_loader), hydra_loader)
    jobs = grid(["workload=gemm", "workload=hessian"],
                ["framework.precision=default", "framework.precision=tf32"])
    composer.check_values(jobs)
    with pytest.raises(UserError, match="tf32"):
        composer.spec(jobs[3], 3)
    assert_same(composer, jobs)


def test_replace_path_shares_what_it_does_not_change():
    config = DvfsConfig()
    new = replace_path(config, ("device", "sm_clock_mhz"), 1110)
    assert new.device.sm_clock_mhz == 1110 and config.device.sm_clock_mhz is None
    assert new.measure is config.measure and new.workload is config.workload
    inject = replace_path({"a": {"b": 1}, "c": [2]}, ("a", "b"), 3)
    assert inject == {"a": {"b": 3}, "c": [2]}


# --- random override sets ------------------------------------------------------------------------
VALUES = {
    "workload": ["gemm", "stencil", "selu", "conv3d", "mlp_train", "hessian", "nope"],
    "framework": ["jax", "tensorflow"],
    "measure": ["default", "quick"],
    "experiment": ["quickstart", "seed_claims"],
    "device.sm_clock_mhz": ["null", "510", "1410", "[510,1410]", "abc"],
    "device.power_limit_w": ["null", "150", "300.5", "-1"],
    "device.count": ["1", "4"],
    "workload.size": ["tiny", "cpu", "gpu", "huge"],
    "workload.dtype": ["float32", "bfloat16", "float16"],
    "framework.precision": ["default", "highest", "tf32"],
    "measure.repeats": ["1", "3", "0"],
    "measure.window_s": ["0.5", "2", "1e-3"],
    "seed": ["0", "7", "'x'"],
    "store_dir": ["null", "/tmp/dvfs-compose-a", "/tmp/dvfs-compose-b"],
    "objective": ["edp", "energy_per_work", "speed"],
    "quiet": ["true", "false"],
    "+device.nope": ["1"],
    "hydra.launcher.timeout_s": ["5"],
}


@st.composite
def batches(draw):
    """A batch of jobs as a sweep makes them: a grid over a few keys, plus common overrides."""
    keys = draw(st.lists(st.sampled_from(sorted(VALUES)), min_size=1, max_size=4, unique=True))
    common_keys = draw(st.lists(st.sampled_from(sorted(set(VALUES) - set(keys))), max_size=2,
                                unique=True))
    common = [f"{k}={draw(st.sampled_from(VALUES[k]))}" for k in common_keys]
    axes = [
        [f"{k}={v}" for v in draw(st.lists(st.sampled_from(VALUES[k]), min_size=1, max_size=3,
                                           unique=True))]
        for k in keys
    ]
    order = draw(st.permutations(range(len(axes))))
    return common, grid(*[axes[i] for i in order])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(batch=batches())
@pytest.mark.slow
def test_random_override_sets_compose_as_hydra_composes_them(hydra_loader, batch):
    common, jobs = batch
    composer = SweepComposer(master(hydra_loader), hydra_loader)
    assert_same(composer, [[*common, *j] for j in jobs])
