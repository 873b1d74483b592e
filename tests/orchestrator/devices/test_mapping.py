"""A node's view of the machine: its own simulated machine, no job's settings (which GPU a Ray
GPU id names: ``tests/orchestrator/test_launch_units.py``)."""

from __future__ import annotations

from orchestrator.config import PER_JOB_KEYS, DeviceConfig
from orchestrator.devices import SIM_STATE_ENV
from orchestrator.devices.mapping import node_device_config


def test_a_node_sees_its_own_simulated_machine_and_no_job_settings(monkeypatch, tmp_path):
    monkeypatch.setenv(SIM_STATE_ENV, str(tmp_path))
    sent = {"backend": "sim", "count": 2, "sm_clock_mhz": 1065, "gpus": [1], "inject": "x"}
    node = node_device_config(sent)  # a plain mapping, as the driver sends it over Ray
    assert isinstance(node, DeviceConfig)
    assert (node.state_dir, node.count) == (str(tmp_path), 2)
    assert all(getattr(node, key) is None for key in PER_JOB_KEYS)


def test_a_real_gpus_node_keeps_the_state_dir_it_was_given(monkeypatch, tmp_path):
    monkeypatch.setenv(SIM_STATE_ENV, str(tmp_path))
    node = node_device_config(DeviceConfig(backend="nvml", power_limit_w=200.0))
    assert (node.backend, node.state_dir, node.power_limit_w) == ("nvml", None, None)
