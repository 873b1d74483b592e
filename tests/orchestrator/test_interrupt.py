"""Ctrl-C and SIGTERM are never lost: recorded, raised, checked again where Python dropped them."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from support import signal_in_a_gc_callback

from orchestrator import interrupt


def test_the_first_signal_raises_and_is_remembered_for_the_command():
    with interrupt.handling():
        assert interrupt.received() is None
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            signal.raise_signal(signal.SIGTERM)
        assert interrupt.terminated() and interrupt.exit_code() == 143
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            interrupt.check()
    with interrupt.handling():  # the next command starts afresh
        assert interrupt.received() is None
        interrupt.check()


def test_a_nested_block_keeps_the_outer_commands_signal_and_handlers():
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs as a background job
    with interrupt.handling():
        handler = signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        with interrupt.handling():  # `dvfs sweep` runs the app, which opens its own block
            assert interrupt.received() == signal.SIGINT
            assert signal.getsignal(signal.SIGINT) is handler
        assert signal.getsignal(signal.SIGINT) is handler
    assert signal.getsignal(signal.SIGINT) is before


def test_a_signal_inside_a_step_that_must_not_be_cut_is_raised_when_the_step_ends():
    steps = []
    with interrupt.handling():
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            with interrupt.deferred():  # as ray.init runs in it
                signal.raise_signal(signal.SIGINT)
                steps.append("went on to the step's end")
            steps.append("not reached")
    assert steps == ["went on to the step's end"]


def test_a_second_signal_while_stopping_says_how_to_force_it_and_raises_nothing(capfd):
    with interrupt.handling():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # while stopping: a message, no exception
        assert interrupt.exit_code() == 130
    err = capfd.readouterr().err
    assert "already stopping" in err and "Ctrl-C again" in err and "dvfs restore" in err


def test_a_third_signal_forces_the_process_out_with_the_first_signals_code(tmp_path):
    import subprocess
    import sys

    code = (
        "import signal, time\n"
        "from orchestrator import interrupt\n"
        "with interrupt.handling():\n"
        "    try:\n"
        "        signal.raise_signal(signal.SIGTERM)\n"
        "    except KeyboardInterrupt:\n"
        "        signal.raise_signal(signal.SIGINT)\n"
        "        signal.raise_signal(signal.SIGINT)\n"
        "        time.sleep(60)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 143
    assert "already stopping" in done.stderr and "stopped at once" in done.stderr


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the drop itself
def test_a_ctrl_c_dropped_mid_trial_stops_an_in_process_sweep_and_stores_no_cut_window(
    sim_dir, tmp_path
):
    """hydra/launcher=basic: the trial runs in this process, under its guard. Ctrl-C lands in a
    gc callback while the GPU is set: the guard's handler puts the GPU back at once, then Python
    drops the KeyboardInterrupt. The sweep must still stop, store no trial measured across the
    restore, and leave the GPU as it found it."""
    from orchestrator.app import run_sweep
    from orchestrator.devices.sim.state import Machine
    from orchestrator.results.store import ResultStore

    sweep_dir = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=basic", "workload.size=tiny", "measure=quick", "quiet=true",
            "device.sm_clock_mhz=1065,1110,1155", "seed=31", f"hydra.sweep.dir={sweep_dir}"]

    with signal_in_a_gc_callback(signal.SIGINT) as gc_signal:

        def arm_once_the_gpu_is_set():
            while not (sim_dir / "machine.json").exists() or Machine(sim_dir).read(0)[
                    "locked_sm_mhz"] is None:
                time.sleep(0.005)
            gc_signal.arm()

        threading.Thread(target=arm_once_the_gpu_is_set, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            run_sweep(args)
    assert gc_signal.sent == [signal.SIGINT]
    gpu = Machine(sim_dir).read(0)
    assert gpu["locked_sm_mhz"] is None and gpu["power_limit_w"] == 400
    assert not list((sim_dir / "journal").glob("*.json"))
    rows = []
    if (sweep_dir / "trials.sqlite").exists():
        with ResultStore(sweep_dir, readonly=True) as store:
            rows = store.rows()
    assert rows == []  # the first trial was cut by the restore; none after it ran
