"""Every config composes: the root config, each group option and each experiment."""

from __future__ import annotations

import pytest

from orchestrator.config import CONF_DIR, compose, validate_static
from orchestrator.errors import UserError

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
GROUPS = {
    g: sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml"))
    for g in ("device", "workload", "framework", "measure")
}


def test_the_root_config_defaults_to_the_simulated_gpu():
    cfg = compose([])
    assert cfg.device.backend == "sim"
    validate_static(cfg)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_validates(name):
    cfg = compose([f"experiment={name}"])
    validate_static(cfg)


@pytest.mark.parametrize("group, option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_group_option_composes(group, option):
    cfg = compose([f"{group}={option}"])
    validate_static(cfg)


def test_a_typo_in_a_key_is_a_one_line_user_error():
    with pytest.raises(UserError, match="Key 'windw_s' not in 'MeasureConfig'") as e:
        compose(["measure.windw_s=2"])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "device, size", [("sim", "tiny"), ("cpu", "cpu"), ("nvml", "auto"), ("tpu", "auto")]
)
@pytest.mark.parametrize("workload", GROUPS["workload"])
@pytest.mark.slow
def test_the_size_a_kernel_computes_follows_the_device_unless_the_user_sets_it(
    device, size, workload
):
    # The sim's figures come from sim_size whatever it computes, so it computes little; the CPU
    # measures what it computes; a real GPU or a TPU the largest size that fits it.
    overrides = [f"device={device}", f"workload={workload}"]
    assert compose(overrides).workload.size == size
    assert compose([*overrides, "workload.size=gpu"]).workload.size == "gpu"
    assert compose([*overrides, "device.default_size=cpu"]).workload.size == "cpu"
