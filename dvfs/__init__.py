"""Measure your own program: windows of time and energy, charged steps, and your result.

Import it in a training or inference script (it imports none of Ray, Hydra, TensorFlow, JAX or
PyTorch; ~0.1 s)::

    import dvfs

    step = dvfs.charged(train_step, items=batch)   # the sim: charged its compiled work, faults
    with dvfs.window("train", unit="samples") as w:
        for _ in range(steps):
            params, loss = step(params, x, y)
    print(w.result.time_s, w.result.energy_j, w.result.energy_per_item_j)
    dvfs.report_result({"loss": float(loss)})

or with named windows, as Zeus's ``begin_window``/``end_window``::

    monitor = dvfs.Monitor()
    monitor.begin_window("epoch")
    ...
    measured = monitor.end_window("epoch", items=samples)

Stand-alone it measures the GPUs the process uses (``CUDA_VISIBLE_DEVICES``; NVML), the host
CPU (RAPL) where there is no GPU, or the simulated GPU with ``DVFS_DEVICE=sim``. Run by
``dvfs sweep workload=command workload.argv=[python,train.py]`` or ``dvfs monitor -- python
train.py``, its windows and result go to the trial's row. See ``docs/programs.md``.
"""

from orchestrator.measuring.program import (
    Charged,
    GpuEnergy,
    Monitor,
    SimulatedCrash,
    Window,
    WindowHandle,
    begin_window,
    charged,
    end_window,
    report_result,
    sync_frameworks,
    window,
)

__all__ = [
    "Charged",
    "GpuEnergy",
    "Monitor",
    "SimulatedCrash",
    "Window",
    "WindowHandle",
    "begin_window",
    "charged",
    "end_window",
    "report_result",
    "sync_frameworks",
    "window",
]
