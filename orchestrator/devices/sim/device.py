"""The simulated GPU as a ``Device``: the NVML adapter plus the sim's clock and work model.

Everything NVML can do goes through ``NvmlDevice`` unchanged, over the simulated NVML module. The
three things real NVML has no call for come from the sim's extensions (``simDevice*``): the
device's virtual clock (``now_s``), idle time that advances it (``idle``), and the accounting of a
finished kernel call (``on_kernel_call``), which advances the virtual clock and the energy counter
by the GPU model and says whether the call was faulted.
"""

from __future__ import annotations

import contextlib
from typing import Any

from orchestrator.devices.base import Fault, KernelWork
from orchestrator.devices.nvml import NvmlBackend, NvmlDevice
from orchestrator.devices.nvml.errors import nvml_errors


class SimBackend(NvmlBackend):
    """An NVML backend over the simulated NVML module; its devices are ``SimDevice``s."""

    def _make_device(self, handle: Any) -> SimDevice:
        return SimDevice(self, handle)

    def close(self) -> None:
        """Leave the GPUs this process held (``simReleaseProcess``: NVML no longer lists it
        among their running processes, as when a worker's contexts go), then shut NVML down."""
        if self._open:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.simReleaseProcess()
        super().close()


class SimDevice(NvmlDevice):
    """A simulated GPU: NVML calls through the adapter, time and work through the sim's model."""

    def _sim(self, fn: str, *args: Any) -> Any:
        with nvml_errors(self._nvml, fn, f"GPU {self.identity.index} ({self.identity.uuid})"):
            return getattr(self._nvml, fn)(self._handle, *args)

    def now_s(self) -> float:
        """The GPU's virtual clock in seconds (``simDeviceGetTimeS``), not the wall clock."""
        return float(self._sim("simDeviceGetTimeS"))

    def idle(self, seconds: float) -> None:
        """Let the GPU sit idle for ``seconds`` of virtual time (no sleep); 0 or less: nothing."""
        if seconds > 0:
            self._sim("simDeviceIdle", float(seconds))

    def on_kernel_call(self, work: KernelWork) -> Fault:
        """Account one kernel call on the model (time, energy, clocks); the fault it drew."""
        return self._sim("simDeviceRecordKernelCall", work).fault

    def charge_busy(self, seconds: float) -> None:
        """Account ``seconds`` of undeclared work as one memory-bound busy call
        (``simDeviceRecordBusy``): its time is ``seconds`` at any SM clock."""
        self._sim("simDeviceRecordBusy", float(seconds))

    def model_allocation(self, in_use_bytes: int, framework: str) -> int | None:
        """Record what the trial's process would hold on a real board (``sim.memory``): NVML's
        used memory reports it from now on; returns it."""
        from orchestrator.devices.sim.memory import process_bytes

        held = process_bytes(in_use_bytes, framework)
        self._sim("simDeviceSetAllocatedBytes", held)
        return held

    def stability_threshold_mhz(self, kernel_class: str, framework: str = "") -> int:
        """The planted or seeded threshold (ground truth, for tests and reports on the sim)."""
        return int(self._sim("simDeviceGetStabilityThresholdMhz", kernel_class, framework))
