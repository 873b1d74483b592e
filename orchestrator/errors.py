"""The project's exceptions, and how a library's error about the input becomes one of them.

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

from collections.abc import Callable
from pathlib import Path


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


# --- Hydra's and OmegaConf's errors, as the one line a user's mistake gets --------------------
def close_on_exit(
    close: Callable[[], None], exc: BaseException | None, what: str
) -> None:
    """Close what a ``with`` block held; when the block raised, a failure to close is noted on
    the block's error instead of raised (a raise here would hide the error on its way).

    Args:
        close: the closing call (a restore, a release).
        exc: the error the block raised (None: it ended normally, and ``close`` raises as is).
        what: what failed to close, for the note ("restoring GPU 0").
    """
    if exc is None:
        close()
        return
    try:
        close()
    except DvfsError as e:
        exc.add_note(f"{what} failed too: {e}")


def one_line(message: str) -> str:
    """Hydra and OmegaConf write several lines (full_key, object_type...); keep what matters."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("object_type=", "Set the environment"))]
    return "; ".join(keep[:2]) if keep else str(message)


def hydra_user_error(e: BaseException) -> UserError | None:
    """Turn a Hydra/OmegaConf composition error into a one-line UserError (None: not one)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(e, UserError):
        return e
    conversion = isinstance(e, (ValueError, TypeError, ArithmeticError))
    if conversion and _raised_in(e, ("hydra", "omegaconf")):
        # Hydra's defaults list raises plain ValueErrors about the input ("Config group override
        # must be a string or a list"), not HydraExceptions.
        return UserError(one_line(str(e)))
    if isinstance(e, (HydraException, OmegaConfBaseException)):
        cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else None
        text = one_line(str(e))
        if cause is not None and one_line(str(cause)) not in text:
            text = f"{text}: {one_line(str(cause))}"
        return UserError(text)
    return None


def _raised_in(e: BaseException, packages: tuple[str, ...]) -> bool:
    """True if the innermost frame of ``e``'s traceback is in one of these installed packages."""
    import sys

    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = Path(tb.tb_frame.f_code.co_filename).resolve()
    for name in packages:
        module = sys.modules.get(name)
        root = getattr(module, "__file__", None)
        if root and Path(root).resolve().parent in filename.parents:
            return True
    return False
