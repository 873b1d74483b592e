"""The worker of one GPU (``orchestrator.measuring.worker.GpuWorker``), made in this process."""

from __future__ import annotations

import json
import os

from orchestrator.devices import SIM_STATE_ENV, open_backend
from orchestrator.measuring.worker import WORKER_ENV, GpuWorker


def test_the_drivers_env_is_set_over_what_the_worker_inherited_before_it_opens_its_gpu(
        tmp_path, monkeypatch):
    """The driver hands every worker its variables as an argument, not as a Ray runtime env (a
    second Python start per worker). They must win over what the worker's process inherited
    from the Ray instance (another sweep's simulated machine, a user's preallocation switch),
    and be in place before the worker opens its GPU: it joins the machine the driver named."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    for state, count in ((mine, 2), (other, 1)):
        monkeypatch.setenv(SIM_STATE_ENV, str(state))
        open_backend({"backend": "sim", "count": count}).close()
    # what the Ray instance's processes inherited: the other machine, and a user's switch
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    env = {**WORKER_ENV, SIM_STATE_ENV: str(mine)}
    del env["TF_CPP_MIN_LOG_LEVEL"]  # one the driver does not send: filled as unset

    worker = GpuWorker({"backend": "sim", "count": 2}, ray_gpu_id=1, env=env)
    try:
        assert os.environ[SIM_STATE_ENV] == str(mine)
        assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == WORKER_ENV["TF_CPP_MIN_LOG_LEVEL"]
        gpus = json.loads((mine / "machine.json").read_text())["gpus"]
        assert worker.uuid in {g["uuid"] for g in gpus}  # GPU 1 exists only on `mine`
    finally:
        worker.close()
