"""The simulated GPU against published measurements: every anchor inside its accepted range.

The anchors and their ranges (published, widened by a stated margin where the published kernel or
board differs from ours) live in ``orchestrator/devices/sim/calibration.py``; this is the test the
issue asks for, and ``scripts/sim_vs_published.py`` prints the same table.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import REPO

from orchestrator.devices.base import KernelWork
from orchestrator.devices.sim import calibration as cal
from orchestrator.devices.sim import model
from orchestrator.devices.sim.held_out import HELD_OUT
from orchestrator.devices.sim.profile import available_profiles, load_profile

RESULTS = cal.evaluate()


def _id(r: cal.AnchorResult) -> str:
    return f"{r.anchor.source}|{r.anchor.setting}|{r.anchor.figure}"


@pytest.mark.parametrize("result", RESULTS, ids=_id)
def test_each_anchor_is_inside_its_accepted_range(result):
    a = result.anchor
    assert a.low <= result.value <= a.high, f"{_id(result)}: {result.value} not in {a.low}-{a.high}"


def test_every_anchor_names_a_shipped_profile_and_says_why_a_range_is_widened():
    for a in cal.ANCHORS:
        assert a.profile in available_profiles()
        assert a.low < a.high
    # Every source the issue lists has at least one row.
    sources = {a.source.split(" (")[0].split(" et al")[0] for a in cal.ANCHORS}
    for wanted in ("arXiv 2605.11999", "arXiv 2501.08219", "Zeus NSDI'23", "McDonald", "Tang",
                   "Kernel Tuner", "arXiv 2605.23918", "AccelWattch MICRO'21", "nvidia-smi -q"):
        assert any(s.startswith(wanted) for s in sources), wanted


def test_a_memory_bound_kernel_saves_energy_at_a_lower_sm_clock_at_no_cost_in_time():
    # The defect the power model fixes: with no clock term, a memory-bound kernel saved < 3%.
    for key in ("a100_sxm4_40gb", "h200_141gb"):
        p = load_profile(key)
        nbytes = p.memory_bandwidth_gbs * 1e9 * 0.01
        stream = [cal.Phase(KernelWork(nbytes / 8, nbytes, "fp32", "stencil"))]
        top = cal.step_at(p, stream, p.f_max_mhz)
        low = cal.step_at(p, stream, p.sm_clocks_mhz[len(p.sm_clocks_mhz) // 2])
        assert low.time_s <= top.time_s * 1.01
        assert low.energy_j <= top.energy_j * 0.85


def test_a_capped_step_runs_the_highest_clock_whose_average_power_fits():
    p = load_profile("v100_sxm2_16gb")
    phases = cal.training_step(p, cal.RESNET50)
    capped = cal.step_point(p, phases, power_limit_w=150)
    assert capped.power_w <= 150
    above = [c for c in p.sm_clocks_mhz if c > capped.clock_mhz]
    assert cal.step_at(p, phases, above[0]).power_w > 150


def test_the_clock_term_does_not_scale_with_alu_utilisation():
    p = load_profile("a100_sxm4_40gb")
    idle_alu = model.power_w(p, 0.0, 0.0, p.f_max_mhz) - model.power_w(p, 0.0, 0.0, p.f_min_mhz)
    floor = p.f_min_mhz / p.f_max_mhz * (p.v_min_v / p.v_max_v) ** 2  # the clock term at f_min
    assert idle_alu > 0.8 * p.power.clock * (1 - floor)


def test_leakage_rises_with_temperature():
    p = load_profile("h100_sxm5_80gb")
    cool = model.power_w(p, 1.0, 0.1, p.f_max_mhz, temperature_c=40)
    hot = model.power_w(p, 1.0, 0.1, p.f_max_mhz, temperature_c=80)
    expected = p.power.leakage * (2 ** (20 / 40) - 2 ** (-20 / 40))  # v_max: V/V_max = 1
    assert hot - cool == pytest.approx(expected, rel=1e-9)


def test_the_script_prints_every_anchor_and_exits_zero():
    script = REPO / "scripts" / "sim_vs_published.py"
    out = subprocess.run([sys.executable, str(script), "--markdown"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == len(cal.ANCHORS) + len(HELD_OUT) + 2  # two headers
    assert f"{len(cal.ANCHORS)} of {len(cal.ANCHORS)} anchors inside" in out.stdout
    fitted, held = out.stdout.split("Held out:")
    assert "MAMF" in fitted and "zzc0721" not in fitted and "zzc0721" in held
