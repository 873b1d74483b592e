"""The project's exceptions.

Two families, because a user needs to know whose fault a failure is:

- ``UserError``: the input was wrong (an unsupported clock, an unknown workload, a typo in a key).
  The CLI prints its message on one line and exits with code 2, with no traceback, and it is
  always raised before any device setting is touched.
- ``DeviceError``: the device or the driver refused or failed (no permission, not supported, GPU
  lost). Each carries a message that names the call, the GPU and what to do.
- ``StorageError``: results could not be written (a full disk, an I/O error). Every trial stored
  before is kept; the message says to free space and run the same command again (exit code 4).

NVML's own error classes never travel above the NVML adapter: it maps them to these.
"""

from __future__ import annotations


class DvfsError(Exception):
    """Base class of every error this project raises on purpose."""


class UserError(DvfsError):
    """Bad input: refused with a one-line message and exit code 2, before anything runs."""

    exit_code = 2


class DeviceError(DvfsError):
    """The device or its driver refused or failed a call."""

    exit_code = 3


class StorageError(DvfsError):
    """A result could not be written where it belongs; what was stored before is kept."""

    exit_code = 4


class DevicePermissionError(DeviceError):
    """The driver refused a setter because the process is not privileged."""


class DeviceNotSupportedError(DeviceError):
    """The device or driver does not support the call (e.g. no energy counter before Volta)."""


class InvalidSettingError(UserError):
    """A value the device does not support (the driver said INVALID_ARGUMENT, or we checked first).

    Refused before anything is set, like any bad input.
    """


class DeviceLostError(DeviceError):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST); it takes no further trials."""


class DeviceNotFoundError(UserError):
    """No device with that index, UUID or PCI bus id."""


class PolicyViolationError(UserError):
    """A setting outside the guard's policy (allowed clock and power ranges)."""


class DeviceBusyError(DeviceError):
    """Another process holds this GPU's lease: two sweeps never drive one GPU at once."""


class UnrestoredDeviceError(UserError):
    """A journal entry from a killed process is still open: run ``dvfs restore`` first."""
