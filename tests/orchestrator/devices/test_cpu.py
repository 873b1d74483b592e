"""The host CPU as a device: RAPL energy read from a directory shaped like sysfs, identity from
the OS, and no settings."""

from __future__ import annotations

import errno
import os
import platform

import numpy as np
import pytest

from orchestrator.devices import journal_dir, open_backend, select_devices
from orchestrator.devices.base import ClockEventReason
from orchestrator.devices.cpu import CpuBackend, CpuDevice, HostPaths, _why, cpu_model_name
from orchestrator.errors import DeviceNotFoundError, DeviceNotSupportedError, UserError
from orchestrator.jobs.request import SettingsRequest
from orchestrator.measuring.guard import SettingsGuard
from orchestrator.measuring.journal import Journal

RANGE_UJ = 262_143_328_850  # what a Xeon's package zone shows: 2**32 units of 61.04 uJ


def zone(root, directory, energy_uj, *, name=None, range_uj=RANGE_UJ):
    """A powercap zone as the kernel lays it out: energy_uj, max_energy_range_uj, name."""
    path = root / directory
    path.mkdir(parents=True, exist_ok=True)
    if energy_uj is not None:
        (path / "energy_uj").write_text(f"{energy_uj}\n")
    if range_uj is not None:
        (path / "max_energy_range_uj").write_text(f"{range_uj}\n")
    (path / "name").write_text(f"{name or 'package-' + directory.split(':')[1]}\n")
    return path


def set_energy(path, energy_uj):
    (path / "energy_uj").write_text(f"{energy_uj}\n")


def cpu(powercap_root, **host):
    return CpuDevice(powercap_root, host=HostPaths(**host)) if host else CpuDevice(powercap_root)


# --- energy -------------------------------------------------------------------------------------
def test_energy_is_the_sum_of_every_package_in_millijoules(tmp_path):
    p0 = zone(tmp_path, "intel-rapl:0", 5_000_000)
    p1 = zone(tmp_path, "intel-rapl:1", 7_000_500)
    device = cpu(tmp_path)
    assert device.capabilities().has_energy_counter
    assert device.capabilities().energy_note is None
    first = device.energy_mj()
    assert first == 12_000  # 12_000_500 uJ, in whole mJ
    set_energy(p0, 5_000_000 + 2_500_000)
    set_energy(p1, 7_000_500 + 1_000_000)
    assert device.energy_mj() - first == 3_500


def test_subzones_and_the_platform_zone_are_not_counted_twice(tmp_path):
    p0 = zone(tmp_path, "intel-rapl:0", 1_000_000)
    core = zone(tmp_path, "intel-rapl:0:0", 900_000, name="core")
    dram = zone(tmp_path, "intel-rapl:0:1", 50_000, name="dram")
    psys = zone(tmp_path, "intel-rapl:1", 3_000_000, name="psys")  # the platform: packages included
    zone(tmp_path, "intel-rapl-mmio:0", 1_000_000)  # the same package through MMIO
    device = cpu(tmp_path)
    assert [z.name for z in device.rapl.zones] == ["package-0"]
    first = device.energy_mj()
    assert first == 1_000
    for path, value in ((core, 5_000_000), (dram, 5_000_000), (psys, 9_000_000)):
        set_energy(path, value)
    assert device.energy_mj() == first  # only the package counts
    set_energy(p0, 1_400_000)
    assert device.energy_mj() == first + 400


def test_a_wrap_around_adds_what_was_used_and_the_total_keeps_growing(tmp_path):
    """The counter runs 0..max_energy_range_uj, then starts again from 0."""
    p0 = zone(tmp_path, "intel-rapl:0", RANGE_UJ - 500_000)  # half a joule before the wrap
    device = cpu(tmp_path)
    before_uj = device.rapl.read_uj()
    set_energy(p0, 1_500_000)  # wrapped: 500_000 + 1 to reach 0, then 1_500_000
    after_uj = device.rapl.read_uj()
    assert after_uj - before_uj == 2_000_001
    set_energy(p0, 2_000_000)  # and on from there, no wrap
    assert device.rapl.read_uj() - after_uj == 500_000
    assert device.energy_mj() == (before_uj + 2_500_001) // 1000


def test_many_wraps_on_two_packages_sum_to_the_energy_used(tmp_path):
    range_uj = 10_000_000  # a short range, so that a few hundred reads wrap it many times
    paths = [zone(tmp_path, f"intel-rapl:{i}", 9_000_000, range_uj=range_uj) for i in (0, 1)]
    device = cpu(tmp_path)
    rng = np.random.default_rng(7)
    raw = [9_000_000, 9_000_000]
    used_uj = 0
    start_mj = device.energy_mj()
    readings = [start_mj]
    for _ in range(300):
        for i, path in enumerate(paths):
            step = int(rng.integers(0, range_uj // 2))  # less than a range between two reads
            raw[i] = (raw[i] + step) % (range_uj + 1)
            used_uj += step
            set_energy(path, raw[i])
        readings.append(device.energy_mj())
    assert readings == sorted(readings)  # never decreases
    assert device.rapl.read_uj() - 18_000_000 == used_uj
    assert readings[-1] - start_mj == pytest.approx(used_uj / 1000, abs=1)


# --- no counter, and why ------------------------------------------------------------------------
def test_no_powercap_directory_is_no_counter_and_the_note_says_so(tmp_path):
    device = cpu(tmp_path / "absent")
    caps = device.capabilities()
    assert not caps.has_energy_counter and not caps.has_power_sensor
    assert caps.energy_note == (
        f"no RAPL energy counter: {tmp_path / 'absent'} does not exist "
        f"(no powercap in this kernel or VM)"
    )
    with pytest.raises(DeviceNotSupportedError, match="no RAPL energy counter"):
        device.energy_mj()
    assert device.telemetry().energy_mj is None


def test_a_powercap_tree_without_intel_rapl_zones_is_no_counter(tmp_path):
    (tmp_path / "dtpm").mkdir()  # another control type
    zone(tmp_path, "intel-rapl:0:0", 1_000, name="core")  # a subzone alone is no package
    note = cpu(tmp_path).capabilities().energy_note
    assert note == f"no RAPL energy counter: {tmp_path} has no intel-rapl package zone"


def test_an_energy_uj_that_cannot_be_read_is_no_counter_and_the_note_names_it(tmp_path):
    p0 = zone(tmp_path, "intel-rapl:0", None)
    (p0 / "energy_uj").mkdir()  # reading it fails, as a root-only file does for a user
    caps = cpu(tmp_path).capabilities()
    assert not caps.has_energy_counter
    assert caps.energy_note == f"no RAPL energy counter: {p0 / 'energy_uj'}: Is a directory"


def test_a_missing_energy_uj_or_range_is_no_counter(tmp_path):
    p0 = zone(tmp_path / "a", "intel-rapl:0", None)
    assert cpu(tmp_path / "a").capabilities().energy_note == (
        f"no RAPL energy counter: {p0 / 'energy_uj'}: No such file or directory"
    )
    p1 = zone(tmp_path / "b", "intel-rapl:0", 1_000, range_uj=None)
    note = cpu(tmp_path / "b").capabilities().energy_note
    assert note == (
        f"no RAPL energy counter: {p1 / 'max_energy_range_uj'}: No such file or directory "
        f"(needed to unwrap {p1 / 'energy_uj'})"
    )


def test_one_unreadable_package_is_no_counter_rather_than_half_the_machine(tmp_path):
    zone(tmp_path, "intel-rapl:0", 1_000)
    p1 = zone(tmp_path, "intel-rapl:1", None)
    caps = cpu(tmp_path).capabilities()
    assert not caps.has_energy_counter
    assert str(p1 / "energy_uj") in caps.energy_note


def test_permission_denied_says_energy_uj_is_root_only_since_linux_5_10(tmp_path):
    path = tmp_path / "intel-rapl:0" / "energy_uj"
    why = _why(path, PermissionError(errno.EACCES, "Permission denied"))
    assert why == (
        f"{path}: Permission denied (energy_uj is readable by root only since Linux 5.10 "
        f"(CVE-2020-8694))"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_a_root_only_energy_uj_is_no_counter_for_a_user(tmp_path):
    p0 = zone(tmp_path, "intel-rapl:0", 1_000)
    (p0 / "energy_uj").chmod(0)
    note = cpu(tmp_path).capabilities().energy_note
    assert "Permission denied (energy_uj is readable by root only since Linux 5.10" in note


# --- identity -----------------------------------------------------------------------------------
def test_identity_comes_from_the_os():
    device = CpuDevice()
    ident = device.identity
    model = cpu_model_name(HostPaths().cpuinfo)
    assert ident.name == f"{model} ({os.cpu_count()} CPUs)"
    assert device.model_name == model and device.cpu_count == os.cpu_count()
    assert ident.backend == "cpu" and ident.index == 0
    assert ident.architecture == platform.machine()
    assert ident.driver_version == platform.release()
    assert ident.uuid.startswith("CPU-") and len(ident.uuid) == len("CPU-") + 36
    assert CpuDevice().identity.uuid == ident.uuid  # stable across opens on one machine


def test_the_model_name_is_read_from_cpuinfo_and_falls_back_to_python(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\n"
        "model name\t: Intel(R) Xeon(R) Platinum 8480+\ncpu MHz\t\t: 2000.000\n"
    )
    device = cpu(tmp_path / "none", cpuinfo=cpuinfo)
    assert device.identity.name == f"Intel(R) Xeon(R) Platinum 8480+ ({os.cpu_count()} CPUs)"
    fallback = platform.processor() or platform.machine()
    assert cpu_model_name(tmp_path / "missing") == fallback
    other = tmp_path / "other"
    other.write_text("model name\t: AMD EPYC 9654 96-Core Processor\n")
    assert cpu(tmp_path / "none", cpuinfo=other).identity.uuid != device.identity.uuid


# --- telemetry ----------------------------------------------------------------------------------
def test_the_clock_is_the_mean_core_frequency_from_cpufreq_else_cpuinfo(tmp_path):
    sysfs = tmp_path / "cpu"
    for i, khz in enumerate((2_000_000, 3_000_000)):
        (sysfs / f"cpu{i}" / "cpufreq").mkdir(parents=True)
        (sysfs / f"cpu{i}" / "cpufreq" / "scaling_cur_freq").write_text(f"{khz}\n")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: X\ncpu MHz\t\t: 1000.5\ncpu MHz\t\t: 1201.5\n")
    assert cpu(tmp_path / "pc", cpu_sysfs=sysfs, cpuinfo=cpuinfo).sm_clock_mhz() == 2500
    assert cpu(tmp_path / "pc", cpu_sysfs=tmp_path / "none", cpuinfo=cpuinfo).sm_clock_mhz() == 1101
    empty = cpu(tmp_path / "pc", cpu_sysfs=tmp_path / "none", cpuinfo=tmp_path / "none")
    assert empty.sm_clock_mhz() == 0


def test_the_temperature_is_the_hottest_package_sensor_else_zero(tmp_path):
    thermal, hwmon = tmp_path / "thermal", tmp_path / "hwmon"
    for i, (kind, millis) in enumerate((("acpitz", 90_000), ("x86_pkg_temp", 55_000),
                                        ("x86_pkg_temp", 61_400))):
        (thermal / f"thermal_zone{i}").mkdir(parents=True)
        (thermal / f"thermal_zone{i}" / "type").write_text(f"{kind}\n")
        (thermal / f"thermal_zone{i}" / "temp").write_text(f"{millis}\n")
    assert cpu(tmp_path / "pc", thermal=thermal, hwmon=hwmon).temperature_c() == 61
    (hwmon / "hwmon0").mkdir(parents=True)  # an AMD machine: k10temp, no x86_pkg_temp zone
    (hwmon / "hwmon0" / "name").write_text("k10temp\n")
    (hwmon / "hwmon0" / "temp1_input").write_text("47250\n")
    assert cpu(tmp_path / "pc", thermal=tmp_path / "none", hwmon=hwmon).temperature_c() == 47
    bare = cpu(tmp_path / "pc", thermal=tmp_path / "none", hwmon=tmp_path / "none")
    assert bare.temperature_c() == 0
    assert bare.health().ok


def test_telemetry_reads_energy_and_clocks_and_no_power(tmp_path):
    zone(tmp_path, "intel-rapl:0", 3_000_000)
    tele = cpu(tmp_path).telemetry()
    assert tele.energy_mj == 3_000 and tele.power_mw == 0 and tele.mem_clock_mhz == 0
    assert tele.clock_event_reasons == ClockEventReason.NONE


# --- no settings --------------------------------------------------------------------------------
def test_the_cpu_has_no_settings_and_no_power_sensor(tmp_path):
    device = cpu(tmp_path)
    caps = device.capabilities()
    assert caps.mem_clocks_mhz == () and caps.sm_clocks_mhz == {}
    assert (caps.power_limit_min_w, caps.power_limit_max_w, caps.power_limit_default_w) == (0, 0, 0)
    assert caps.clock_offset_range_mhz is None and not caps.has_power_sensor
    assert device.settings().power_limit_w == 0 and device.settings().clock_offset_mhz is None
    for setter, args in ((device.set_locked_sm_clocks, (1000, 1000)),
                         (device.set_locked_mem_clocks, (1215, 1215)),
                         (device.set_power_limit_w, (100.0,)),
                         (device.set_clock_offset_mhz, (50,))):
        with pytest.raises(DeviceNotSupportedError, match="device=cpu has no settings to change"):
            setter(*args)
    device.reset_locked_sm_clocks()  # nothing was changed, so nothing to put back
    device.reset_locked_mem_clocks()
    with pytest.raises(DeviceNotSupportedError, match="has no power sensor"):
        device.power_mw()
    assert device.clock_event_reasons() == ClockEventReason.NONE
    assert device.health().ok


def test_the_guard_leases_the_cpu_and_writes_no_journal_for_a_default_trial(tmp_path):
    device = cpu(tmp_path / "pc")
    journal = Journal(tmp_path / "journal")
    with SettingsGuard(device, journal) as guard:
        guard.apply(SettingsRequest())
        assert journal.is_leased(device.identity.uuid)
        assert journal.uuids() == []
    assert not journal.is_leased(device.identity.uuid)


# --- the backend --------------------------------------------------------------------------------
def test_the_backend_holds_one_device_found_by_index_or_uuid(tmp_path):
    with CpuBackend(CpuDevice(tmp_path)) as backend:
        assert backend.backend == "cpu" and backend.driver_version == platform.release()
        (device,) = backend.devices()
        assert backend.devices()[0] is device  # one object: it keeps the unwrap state
        assert backend.device(index=0) is device
        assert backend.device(uuid=device.identity.uuid) is device
        assert select_devices(backend, [device.identity.uuid]) == [device]
        assert select_devices(backend, [0]) == [device]
        with pytest.raises(DeviceNotFoundError, match="device=cpu has one device, index 0"):
            backend.device(index=1)
        with pytest.raises(DeviceNotFoundError, match="no CPU device with UUID GPU-x"):
            backend.device(uuid="GPU-x")


def test_open_backend_opens_the_cpu_with_its_powercap_root_and_hides_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("JAX_PLATFORMS", "unset below")  # recorded, so put back after
    monkeypatch.delenv("JAX_PLATFORMS")
    zone(tmp_path, "intel-rapl:0", 2_000_000)
    backend = open_backend({"backend": "cpu", "powercap_root": str(tmp_path)})
    assert isinstance(backend, CpuBackend)
    assert backend.device(index=0).energy_mj() == 2_000
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and os.environ["JAX_PLATFORMS"] == "cpu"
    with pytest.raises(UserError, match="is not one of: sim, nvml, cpu, tpu"):
        open_backend({"backend": "fpga"})


def test_the_cpu_journal_is_its_own_directory():
    assert journal_dir({"backend": "cpu"}).name == "journal-cpu"
    assert journal_dir({"backend": "nvml"}).name == "journal"
