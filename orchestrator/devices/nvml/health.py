"""A GPU's health as NVML tells it: lost, XIDs, uncorrected ECC errors, the slowdown temperature.

``NvmlHealthMonitor`` holds what "since the device was opened" counts from, and makes the checks
of ``Device.health`` (the contract is there) for ``NvmlDevice``. It uses what NVML offers on every
datacenter GPU: ``NVML_ERROR_GPU_IS_LOST`` on any call; XID critical errors delivered as events
(an event set registered for ``nvmlEventTypeXidCriticalError`` when the device is opened, drained
with ``nvmlEventSetWait_v2(set, 0)``); the volatile uncorrected ECC count
(``nvmlDeviceGetTotalEccErrors``), compared with its value when the device was opened; and the
temperature against ``nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)``.
A query the GPU does not support (no ECC, no events) turns that check off, never the device.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from orchestrator.devices.base import Health
from orchestrator.devices.nvml.errors import nvml_errors, translate_nvml_error
from orchestrator.errors import DeviceError, DeviceLostError, DeviceNotSupportedError

# XIDs an application causes (its own bad kernel, a page fault, a stopped or cleaned-up context):
# the trial that caused one is a `crash`, but the GPU is fine for the next trial.
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
XID_NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
_MAX_EVENTS_PER_CHECK = 1000


class NvmlHealthMonitor:
    """The health checks of one opened GPU, with their baselines taken when it was opened.

    Args:
        nvml: the NVML module (nvidia-ml-py's ``pynvml`` or the simulated one).
        call: runs ``nvml.<fn>(handle, *args)`` with NVML's errors translated (the device's).
        temperature_c: reads the GPU's temperature (the first query: a lost GPU fails it).
        target: the GPU as messages name it, e.g. ``GPU 0 (GPU-...)``.
    """

    def __init__(
        self,
        nvml: ModuleType,
        call: Callable[..., Any],
        temperature_c: Callable[[], int],
        target: str,
    ) -> None:
        self._nvml = nvml
        self._call = call
        self._temperature_c = temperature_c
        self._target = target
        self._lock = threading.Lock()
        self._xids: list[int] = []
        self._slowdown_c: int | None | bool = False  # False: not read yet; None: unsupported
        self._ecc_at_open = self._uncorrected_ecc()
        self._events = self._open_xid_events()

    def _monitor(self, fn: Any) -> Any:
        """Run one health query at open; None if the GPU cannot answer it (check turned off)."""
        try:
            return fn()
        except DeviceLostError:
            raise
        except DeviceError:
            return None

    def _uncorrected_ecc(self) -> int | None:
        """The volatile uncorrected ECC count; None where ECC is off or unsupported."""
        nvml = self._nvml
        if not hasattr(nvml, "nvmlDeviceGetTotalEccErrors"):
            return None

        def read() -> int | None:
            if hasattr(nvml, "nvmlDeviceGetEccMode"):
                current = self._call("nvmlDeviceGetEccMode")[0]
                if current != getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                    return None
            return int(
                self._call(
                    "nvmlDeviceGetTotalEccErrors",
                    nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nvml.NVML_VOLATILE_ECC,
                )
            )

        return self._monitor(read)

    def _open_xid_events(self) -> Any:
        """An NVML event set that receives this GPU's XIDs; None where events are unsupported."""
        nvml = self._nvml
        if not hasattr(nvml, "nvmlEventSetCreate"):
            return None

        def create() -> Any:
            with nvml_errors(nvml, "nvmlEventSetCreate", self._target):
                events = nvml.nvmlEventSetCreate()
            try:
                self._call("nvmlDeviceRegisterEvents", nvml.nvmlEventTypeXidCriticalError, events)
            except BaseException:
                with contextlib.suppress(Exception):
                    nvml.nvmlEventSetFree(events)
                raise
            return events

        return self._monitor(create)

    def _drain_xids(self) -> None:
        """Collect the XIDs the driver has reported since the last look (never blocks)."""
        nvml = self._nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        for _ in range(_MAX_EVENTS_PER_CHECK):
            try:
                data = wait(self._events, 0)
            except nvml.NVMLError_Timeout:
                return
            except nvml.NVMLError as e:
                raise translate_nvml_error(nvml, e, "nvmlEventSetWait_v2", self._target) from e
            if int(data.eventType) & nvml.nvmlEventTypeXidCriticalError:
                self._xids.append(int(data.eventData))

    def _slowdown_threshold_c(self) -> int | None:
        if self._slowdown_c is False:
            slowdown = self._nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            try:
                self._slowdown_c = int(self._call("nvmlDeviceGetTemperatureThreshold", slowdown))
            except DeviceNotSupportedError:
                self._slowdown_c = None
        return self._slowdown_c  # type: ignore[return-value]

    def check(self) -> Health:
        """The checks of ``Device.health``, in its order (not sticky: the device makes it so)."""
        gpu = self._target
        with self._lock:
            try:
                return self._device_faults()
            except DeviceLostError:
                reason = f"{gpu} is lost (NVML: GPU is lost, fallen off the bus); it needs a reset"
                return Health(False, reason, "lost")
            except DeviceError as e:
                return Health(False, f"{gpu}: a health query failed: {e}", "query_failed")

    def _device_faults(self) -> Health:
        """XID, then ECC, then thermal; raises what a failed query raises."""
        gpu = self._target
        temperature = self._temperature_c()  # first: a lost GPU fails every call
        if self._events is not None:
            self._drain_xids()
        faults = [x for x in self._xids if x not in APPLICATION_XIDS]
        if faults:
            shown = ", ".join(
                f"{x} ({XID_NAMES.get(x, 'see the NVIDIA XID catalog')})" for x in faults[:3]
            )
            return Health(False, f"{gpu} reported XID {shown}; it needs a reset or a check", "xid")
        if self._ecc_at_open is not None:
            now = self._uncorrected_ecc()
            if now is not None and now > self._ecc_at_open:
                return Health(
                    False,
                    f"{gpu} had {now - self._ecc_at_open} uncorrected ECC error(s) since it was "
                    f"opened (volatile count {self._ecc_at_open} -> {now})",
                    "ecc",
                )
        slowdown = self._slowdown_threshold_c()
        if slowdown is not None and temperature >= slowdown:
            return Health(
                False,
                f"{gpu} is at {temperature} C, at or above its slowdown threshold of {slowdown} C",
                "thermal",
            )
        return Health.healthy()

    def close(self) -> None:
        """Free the XID event set (the backend shuts NVML down)."""
        events, self._events = self._events, None
        if events is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlEventSetFree(events)
