"""The one interface every GPU backend implements.

A ``Device`` is one GPU as the rest of the project sees it: who it is (``DeviceIdentity``), what
may be set on it (``DeviceCapabilities``), setters and resets for locked clocks, the power limit and
the clock offset, and telemetry (energy counter, power, clocks, temperature, clock-event reasons).

Units are in the names and converted once, in the backend: NVML speaks mW, mJ and MHz; this
interface speaks mW/mJ for raw telemetry (``power_mw``, ``energy_mj``) so meters can integrate
without rounding, W for the power limit a user types (``power_limit_w``), and MHz for clocks.

Two methods exist for the simulated GPU's sake and are harmless on real hardware:

- ``now_s()`` is the device's own clock: ``time.perf_counter()`` on a real GPU, the virtual
  clock on the simulated one (whose time advances by the modelled duration of each kernel call).
  Meters and measurement windows read time from here, never from ``time`` directly.
- ``on_kernel_call(work)`` tells the device that one kernel call of that size just finished. A
  real GPU ignores it (the work happened on it); the simulated GPU advances its virtual clock and
  energy counter by the model and says whether the call was faulted (below its stability
  threshold), so the trial can corrupt the real output as unstable silicon would.
"""

from __future__ import annotations

import abc
import enum
import time
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.errors import DeviceNotSupportedError

Backend = Literal["nvml", "sim", "cpu", "tpu"]
Peak = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8"]
HealthFault = Literal["lost", "xid", "ecc", "thermal", "query_failed"]


class ClockEventReason(enum.IntFlag):
    """Why the SM clock is below its maximum, in NVML's bits (``nvmlClocksEventReason*``)."""

    NONE = 0
    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100

    def names(self) -> list[str]:
        """The set reasons as snake-case names (``["sw_power_cap", ...]``), for results."""
        return [r.name.lower() for r in ClockEventReason if r and r in self]  # type: ignore[union-attr]


@dataclass(frozen=True)
class DeviceIdentity:
    """Who a GPU is. ``uuid`` and ``pci_bus_id`` are stable; ``index`` is NVML's (PCI order)."""

    index: int  # NVML index (PCI bus order), not CUDA's numbering
    uuid: str  # "GPU-xxxxxxxx-..." as NVML prints it
    pci_bus_id: str  # "00000000:07:00.0"
    name: str  # marketing name, e.g. "NVIDIA A100-SXM4-40GB"
    architecture: str  # "volta", "ampere", "hopper", ...
    driver_version: str  # e.g. "550.54.15"
    backend: Backend  # "nvml" (real driver), "sim" (simulated NVML) or "cpu" (the host CPU)


PowerReading = Literal["usage", "instant", "average"]  # keys of Device.power_readings_mw()


@dataclass(frozen=True)
class PowerSensing:
    """Which of a GPU's power readings is instantaneous, and how that reading is made.

    A reading updates every ``period_s`` to the mean power over the ``window_s`` before the
    update (Yang et al., SC'24: 100 ms / ~25 ms on GA100 and for Hopper's instant field, 20 ms /
    10 ms on Volta and Pascal). A meter that polls it places each new value ``age_s`` before the
    moment it saw it change (see ``orchestrator/measuring/meter.py``).
    """

    reading: PowerReading | None  # the instant reading a meter polls; None: only a ~1 s average
    period_s: float  # that reading updates this often (0: continuously)
    window_s: float  # ... to the mean power over this long before each update
    note: str  # one line: what each reading is on this GPU, for rows and `dvfs devices`

    @property
    def age_s(self) -> float:
        """How long before a reading's update its window is centred, plus half a period: the
        mean lag of the reading behind the power it reports."""
        return (self.period_s + self.window_s) / 2


@dataclass(frozen=True)
class DeviceCapabilities:
    """What may be set on a GPU, as its driver reports it."""

    mem_clocks_mhz: tuple[int, ...]  # supported memory clocks, descending as NVML lists them
    sm_clocks_mhz: dict[int, tuple[int, ...]]  # memory clock -> supported SM clocks, descending
    power_limit_min_w: float  # lowest settable power limit
    power_limit_max_w: float  # highest settable power limit
    power_limit_default_w: float  # the board's default limit
    clock_offset_range_mhz: tuple[int, int] | None  # (min, max) GPC offset, None if unsupported
    has_energy_counter: bool  # Volta and newer: cumulative mJ since driver load
    has_power_sensor: bool = True  # power_mw() reads the board's power (a CPU has none)
    energy_note: str | None = None  # why there is no counter and no power sensor, for the row
    power_sensing: PowerSensing | None = None  # None: power_mw() is instantaneous, lag 0

    @property
    def max_mem_clock_mhz(self) -> int:
        """The highest memory clock (the one the device runs at by default); 0 for a device with
        no clocks to set (``device=cpu``)."""
        return max(self.mem_clocks_mhz, default=0)

    def supported_sm_clocks_mhz(self, mem_clock_mhz: int | None = None) -> tuple[int, ...]:
        """SM clocks supported at a memory clock (the default memory clock if None), ascending."""
        mem = self.max_mem_clock_mhz if mem_clock_mhz is None else mem_clock_mhz
        return tuple(sorted(self.sm_clocks_mhz.get(mem, ())))


@dataclass(frozen=True)
class DeviceSettings:
    """The settable state of a GPU, as far as the driver lets us read it.

    NVML has no getter for locked clocks, so ``sm_clock_locked_mhz`` and ``mem_clock_locked_mhz``
    are what this process last set (None: not set by us). The guard therefore restores locked
    clocks by resetting them, which is what the driver's default is.
    """

    power_limit_w: float  # current (management) power limit
    clock_offset_mhz: int | None  # current GPC clock offset, None if unsupported
    sm_clock_locked_mhz: tuple[int, int] | None = None  # (min, max) if we locked it
    mem_clock_locked_mhz: tuple[int, int] | None = None  # (min, max) if we locked it


@dataclass(frozen=True)
class KernelWork:
    """The size of one kernel call, for the simulated GPU's roofline and fault model."""

    flops: float  # floating-point operations of one call
    bytes_moved: float  # the fewest bytes one call must move to and from device memory
    peak: Peak  # which compute roof applies (fp32, tf32, bf16, ...)
    kernel_class: str  # the workload name: stability thresholds differ per kernel class
    framework: str = ""  # "jax" or "tensorflow": a sim scenario may depend on it
    launches: int = 1  # device kernels one call launches (an unfused graph launches one per op)
    transcendentals: float = 0.0  # exp, log, tanh... of one call (counted in ``flops`` as one each)
    kind: str = "elementwise"  # "matmul", "conv" or "elementwise" (kernels.cost.WorkKind): which
    # achieved rate of the board (its profile's ``achieved:``) the arithmetic runs at


class Fault(enum.Enum):
    """What the device did to one kernel call (only the simulated GPU ever says other than NONE)."""

    NONE = "none"  # the call computed what it should
    CORRUPT = "corrupt"  # one element of the output has a flipped bit
    CRASH = "crash"  # the call brought the process down (the trial records `crash`)


@dataclass(frozen=True)
class Telemetry:
    """One reading of every sensor, for ``dvfs devices`` and trial records."""

    energy_mj: int | None  # cumulative counter, None where the device has none
    power_mw: int
    sm_clock_mhz: int
    mem_clock_mhz: int
    temperature_c: int
    clock_event_reasons: ClockEventReason = ClockEventReason.NONE
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryInfo:
    """A device's memory, in bytes."""

    total_bytes: int  # what the device has
    free_bytes: int  # what a new allocation may take now


@dataclass(frozen=True)
class Health:
    """Whether a GPU may take another trial, and if not, why (see ``Device.health``)."""

    ok: bool  # False: send this GPU no further trials in this process
    reason: str | None = None  # one line naming the GPU and the fault; None when ok
    kind: HealthFault | None = None  # which check failed; None when ok

    @classmethod
    def healthy(cls) -> Health:
        """A GPU with nothing wrong."""
        return cls(ok=True)


class Device(abc.ABC):
    """One GPU. Backends: ``NvmlDevice`` over nvidia-ml-py, and the same class over the sim."""

    identity: DeviceIdentity

    # --- what may be set -------------------------------------------------------------------
    @abc.abstractmethod
    def capabilities(self) -> DeviceCapabilities:
        """Supported clocks, power-limit range and default, offset range, energy counter."""

    @abc.abstractmethod
    def settings(self) -> DeviceSettings:
        """The current settable state (see ``DeviceSettings`` for what NVML cannot read)."""

    # --- setters and resets (only the guard calls these) -----------------------------------
    @abc.abstractmethod
    def set_locked_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the SM (graphics) clock into [min_mhz, max_mhz]."""

    @abc.abstractmethod
    def reset_locked_sm_clocks(self) -> None:
        """Let the SM clock float again (the driver's default)."""

    @abc.abstractmethod
    def set_locked_mem_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Lock the memory clock into [min_mhz, max_mhz]."""

    @abc.abstractmethod
    def reset_locked_mem_clocks(self) -> None:
        """Let the memory clock float again."""

    @abc.abstractmethod
    def set_power_limit_w(self, watts: float) -> None:
        """Set the power-management limit in watts."""

    @abc.abstractmethod
    def set_clock_offset_mhz(self, offset_mhz: int) -> None:
        """Set the GPC clock offset (0 is the default)."""

    # --- telemetry ---------------------------------------------------------------------------
    @abc.abstractmethod
    def energy_mj(self) -> int:
        """Cumulative energy since driver load in mJ; DeviceNotSupportedError before Volta."""

    @abc.abstractmethod
    def power_mw(self) -> int:
        """Current board power draw in mW."""

    @abc.abstractmethod
    def sm_clock_mhz(self) -> int:
        """Current SM clock."""

    @abc.abstractmethod
    def mem_clock_mhz(self) -> int:
        """Current memory clock."""

    @abc.abstractmethod
    def temperature_c(self) -> int:
        """GPU core temperature."""

    @abc.abstractmethod
    def clock_event_reasons(self) -> ClockEventReason:
        """Why the clock is where it is right now (power cap, thermal, user setting...)."""

    def power_readings_mw(self) -> dict[str, int | None]:
        """Every power reading the device offers, in mW; None for one it does not offer.

        Keys: ``"usage"`` (what ``power_mw`` reads), ``"instant"`` (the sensor's current value)
        and ``"average"`` (the driver's average over about one second). This default knows only
        ``power_mw``; the NVML backend reads the other two from NVML's field values.
        """
        return {"usage": self.power_mw(), "instant": None, "average": None}

    def memory_used_bytes(self) -> int | None:
        """Device memory in use by every process (NVML's ``used``), in bytes; None where the
        device does not say (the CPU)."""
        return None

    def memory_info(self) -> MemoryInfo | None:
        """The device's memory: total and free bytes (NVML's ``nvmlDeviceGetMemoryInfo``, the
        sim's from its profile; the host's ``/proc/meminfo`` for the CPU; JAX's
        ``memory_stats()`` on a TPU); None where the device does not say."""
        return None

    def window_readings(self) -> dict[str, float]:
        """Readings the device offers after a window beside the NVML-like telemetry (a TPU's
        libtpu runtime metrics), as row columns; none by default."""
        return {}

    def float32_matmul_default(self, framework: str) -> str:
        """The arithmetic a float32 matrix product runs in at ``precision=default`` here:
        ``"float32"``, ``"tf32"`` (JAX and TensorFlow on an Ampere or later GPU) or
        ``"bfloat16"`` (one bfloat16 pass: a TPU). The checks' tolerance follows it."""
        del framework
        return "float32"

    def model_allocation(self, in_use_bytes: int, framework: str) -> int | None:
        """The simulated GPU's hook: what a process running a workload whose in-use peak is
        ``in_use_bytes`` would hold (context and allocator pool), now recorded as used. A real
        device allocates for itself: None."""
        del in_use_bytes, framework
        return None

    def instant_power_mw(self) -> int:
        """The instantaneous reading (``capabilities().power_sensing.reading``), in mW.

        This default is ``power_mw``. Raises DeviceNotSupportedError where the GPU offers only
        an average (the NVML backend on Hopper with a driver without the instant field).
        """
        return self.power_mw()

    def telemetry(self) -> Telemetry:
        """Read every sensor once."""
        try:
            energy: int | None = self.energy_mj()
        except DeviceNotSupportedError:  # a device without a counter still has telemetry
            energy = None
        return Telemetry(
            energy_mj=energy,
            power_mw=self.power_mw(),
            sm_clock_mhz=self.sm_clock_mhz(),
            mem_clock_mhz=self.mem_clock_mhz(),
            temperature_c=self.temperature_c(),
            clock_event_reasons=self.clock_event_reasons(),
        )

    # --- health ------------------------------------------------------------------------------
    def health(self) -> Health:
        """Whether this GPU may take another trial.

        The contract every backend keeps (the launcher and the trial runner rely on it):

        - **Unhealthy means retired.** ``ok=False`` means: run no further trial on this GPU in
          this process. A caller stops sending it jobs, records the trials it will not run as
          ``device_error`` with ``reason`` as their error, and goes on with the other GPUs.
        - **Sticky.** The first unhealthy answer is remembered by this ``Device`` object and
          returned by every later call, even if the condition clears (a GPU that cooled down,
          a simulated GPU brought back). A new ``Device`` opened on the same GPU starts afresh:
          the ECC and XID checks count from when *it* was opened, so a caller that retires a GPU
          remembers that by UUID itself instead of re-opening it.
        - **Never raises for the device's condition.** A lost GPU, an NVML query that fails, an
          unsupported query: all are answered with a ``Health``. A query the device does not
          support is skipped (that check is simply not made), never a failure.
        - **Cheap.** A few driver queries (milliseconds; a few file reads on the sim): call it
          before every trial and after every failed one. It changes nothing on the device.
        - **What it checks**, in this order (``kind``): the GPU is lost (``NVML_ERROR_GPU_IS_LOST``:
          ``"lost"``); the driver reported an XID critical error since the device was opened
          (NVML events; XIDs 13, 31, 43 and 45, which applications cause, are not device faults:
          ``"xid"``); uncorrected (double-bit) ECC errors increased since the device was opened
          (``"ecc"``); the temperature is at or above the slowdown threshold (``"thermal"``);
          a health query itself failed (``"query_failed"``).
        - ``reason`` is one line that names the GPU (NVML index and UUID) and the fault.

        Backends implement the checks in ``_check_health``; this method makes the answer sticky.
        """
        failed: Health | None = getattr(self, "_health_failure", None)
        if failed is not None:
            return failed
        health = self._check_health()
        if not health.ok:
            self._health_failure = health
        return health

    def _check_health(self) -> Health:
        """The checks themselves (not sticky). This default knows only "lost": a telemetry call
        that raises ``DeviceLostError``; the NVML backend, real or simulated, makes every check."""
        from orchestrator.errors import DeviceLostError

        try:
            self.temperature_c()
        except DeviceLostError as e:
            return Health(ok=False, reason=str(e), kind="lost")
        return Health.healthy()

    # --- time and work (see the module docstring) ------------------------------------------
    def now_s(self) -> float:
        """The device's clock in seconds (wall clock on real hardware)."""
        return time.perf_counter()

    def idle(self, seconds: float) -> None:
        """Let the device sit idle (settle time): sleep on hardware, advance the sim's clock."""
        if seconds > 0:
            time.sleep(seconds)

    def on_kernel_call(self, work: KernelWork) -> Fault:
        """Account one finished kernel call; real hardware did the work itself."""
        del work
        return Fault.NONE

    def charge_busy(self, seconds: float) -> None:
        """The simulated GPU's hook: ``seconds`` of work it was not told the size of (a user's
        program that declared none) kept it busy. Real hardware did the work itself."""
        del seconds

    def close(self) -> None:
        """Release the handle (the backend shuts NVML down when its last device closes)."""
