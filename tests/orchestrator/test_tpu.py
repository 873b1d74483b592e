"""device=tpu without a TPU: what is refused before anything runs, and the device over a stand-in
for JAX's chip (identity, memory, no settings, no energy, its default arithmetic)."""

from __future__ import annotations

import pytest

from orchestrator.config import compose, validate_static
from orchestrator.devices.tpu import TpuBackend, TpuDevice
from orchestrator.errors import DeviceNotSupportedError, UserError


@pytest.mark.parametrize("override, says", [
    ("framework=tensorflow", "device=tpu runs JAX only: framework=tensorflow"),
    ("framework=pytorch", "device=tpu runs JAX only: framework=pytorch"),
    ("device.sm_clock_mhz=900", "device=tpu has no settings to change: device.sm_clock_mhz=900"),
    ("device.power_limit_w=150", "device=tpu has no settings to change"),
    ("measure.meter=polling", "needs a power sensor, and device=tpu has none"),
])
def test_a_tpu_sweep_that_asks_what_a_tpu_cannot_do_is_refused_in_one_line(override, says):
    with pytest.raises(UserError) as e:
        validate_static(compose(["device=tpu", override]))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_tpu_defaults_to_the_size_that_fits():
    cfg = compose(["device=tpu"])
    validate_static(cfg)
    assert cfg.workload.size == "auto" and cfg.device.backend == "tpu"


class FakeChip:
    """What TpuDevice reads of a ``jax.Device`` on a TPU."""

    device_kind = "TPU v5 lite"
    id = 0

    def memory_stats(self):
        return {"bytes_limit": 16 * 2**30, "bytes_in_use": 3 * 2**30}


def test_a_tpu_chip_says_its_memory_and_arithmetic_and_sets_nothing():
    chip = TpuDevice(FakeChip(), 0, "jax 0.10.2")
    backend = TpuBackend([chip])
    assert backend.device(uuid=chip.identity.uuid) is chip and backend.count() == 1
    assert chip.identity.uuid.startswith("TPU-") and chip.identity.backend == "tpu"
    info = chip.memory_info()
    assert (info.total_bytes, info.free_bytes) == (16 * 2**30, 13 * 2**30)
    assert chip.memory_used_bytes() == 3 * 2**30
    assert chip.float32_matmul_default("jax") == "bfloat16"
    caps = chip.capabilities()
    assert not caps.has_energy_counter and not caps.has_power_sensor
    assert "no power or energy reading" in caps.energy_note
    for refused in (lambda: chip.set_locked_sm_clocks(900, 900), lambda: chip.energy_mj(),
                    lambda: chip.set_power_limit_w(100)):
        with pytest.raises(DeviceNotSupportedError):
            refused()
    assert chip.health().ok


def test_without_a_tpu_device_tpu_says_what_to_use(monkeypatch):
    import orchestrator.devices.tpu as tpu

    def no_tpu():
        raise UserError("device=tpu: JAX finds no TPU here (...); use device=cpu or device=sim")

    monkeypatch.setattr(tpu, "_local_tpus", no_tpu)
    with pytest.raises(UserError, match="use device=cpu"):
        TpuBackend()


def test_where_ray_cannot_start_the_sweep_says_so_in_one_line_naming_the_basic_launcher(
        monkeypatch):
    import ray

    from orchestrator.launching.pool import GpuPool
    from orchestrator.launching.settings import LaunchSettings

    def no_sockets(*args, **kwargs):
        raise OSError("[Errno 97] Address family not supported by protocol")

    monkeypatch.setattr(ray, "init", no_sockets)
    pool = GpuPool(LaunchSettings.from_mapping({}), {"backend": "tpu"}, [])
    assert pool._resource == "TPU"  # a TPU chip is Ray's TPU resource
    with pytest.raises(UserError) as e:
        pool._init_ray({})
    assert "hydra/launcher=basic" in str(e.value) and "\n" not in str(e.value)
