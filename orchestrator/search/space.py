"""The search space: which setting a search walks, in which direction, over which values.

One search covers one ordered setting (:data:`SETTINGS`: the SM clock and the power limit
downward, the clock offset upward). Its values are the GPU's own supported ones, less those its
policy refuses, ordered riskiest first, as :class:`~orchestrator.search.algorithm.ThresholdSearch`
takes them. :class:`SearchOptions` are the sweeper's config keys, checked before anything runs.
Units: MHz for clocks and offsets, W for power limits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from orchestrator.bounds import bounded, check_fields
from orchestrator.errors import UserError
from orchestrator.search.algorithm import CONFIRM_TRIALS

if TYPE_CHECKING:
    from orchestrator.devices.base import DeviceCapabilities
    from orchestrator.jobs.request import SettingsRequest


@dataclass(frozen=True)
class OrderedSetting:
    """A device setting with an order from safe to risky.

    Attributes:
        key: the config key (``device.sm_clock_mhz``).
        column: the trial-row column that records it.
        riskier: ``"lower"`` when lower values are riskier (clocks, power), ``"higher"`` for
            offsets.
        unit: ``"MHz"`` or ``"W"``.
    """

    key: str
    column: str
    riskier: Literal["lower", "higher"]
    unit: str

    @property
    def name(self) -> str:
        """The key without its ``device.`` prefix (``sm_clock_mhz``)."""
        return self.key.split(".", 1)[1]

    @property
    def direction(self) -> str:
        """``downward`` or ``upward``: where the search goes, for messages."""
        return "downward" if self.riskier == "lower" else "upward"


SETTINGS: dict[str, OrderedSetting] = {
    s.key: s
    for s in (
        OrderedSetting("device.sm_clock_mhz", "sm_clock_max_mhz", "lower", "MHz"),
        OrderedSetting("device.power_limit_w", "power_limit_w", "lower", "W"),
        OrderedSetting("device.clock_offset_mhz", "clock_offset_mhz", "higher", "MHz"),
    )
}
"""The ordered settings: the SM clock and the power limit downward, the clock offset upward."""

DEFAULT_POWER_STEP_W = 10.0  # the grid step of a power-limit search (NVML takes any mW value)


def ordered_setting(key: str) -> OrderedSetting:
    """The setting named by ``hydra.sweeper.setting``.

    Raises:
        UserError: the key is not an ordered setting this sweeper can search.
    """
    setting = SETTINGS.get(str(key))
    if setting is None:
        known = ", ".join(f"{k} ({s.direction})" for k, s in SETTINGS.items())
        raise UserError(
            f"hydra.sweeper.setting={key} is not an ordered setting the stability sweeper can "
            f"search; one of: {known}"
        )
    return setting


@dataclass(frozen=True)
class SearchOptions:
    """What ``hydra/sweeper=stability`` is asked to do (its config keys, checked).

    Attributes:
        setting: the ordered setting to search (a key of :data:`SETTINGS`).
        confirm_iterations: ``n``: clean iterations a value needs before it is declared stable.
        coarse_points: values of the first, coarse pass (spread over the whole range).
        step: grid step of a power-limit (W) or clock-offset (MHz) search; None: 10 W, or the
            device's SM clock step for offsets. SM clocks always use the device's own table.
        max_inconclusive: ok-but-invalid trials at one value before the search gives up on it.
        confirm_trials: trials a confirmation spreads its iterations over.
    """

    setting: str = "device.sm_clock_mhz"
    confirm_iterations: int = bounded(
        1000, 1, 1_000_000_000, "a billion clean iterations bound a fault rate below 3 in a "
        "billion; more takes days of trials at one value")
    coarse_points: int = bounded(8, 2, 1000, "more points than any GPU has clocks (~200)")
    step: float | None = bounded(None, 0, 10_000, "a step wider than any setting's range",
                                 above=True)
    max_inconclusive: int = bounded(2, 1, 100, "a hundred ok-but-invalid trials at one value "
                                    "is a value that will not measure")
    confirm_trials: int = bounded(CONFIRM_TRIALS, 1, 1000, "a confirmation over more trials "
                                  "spends more on settling than on iterations")

    def validated(self) -> SearchOptions:
        """The options, checked.

        Raises:
            UserError: an unknown setting, a count that is not whole, a value out of its
                range (``orchestrator.bounds``).
        """
        ordered_setting(self.setting)
        for name in ("confirm_iterations", "coarse_points", "max_inconclusive", "confirm_trials"):
            value = getattr(self, name)
            if isinstance(value, float) and value.is_integer():
                continue  # 8.0 is 8
            if not isinstance(value, int):
                raise UserError(f"hydra.sweeper.{name}={value!r} must be a whole number")
        check_fields("hydra.sweeper.", self, SearchOptions)
        return self

    @property
    def ordered(self) -> OrderedSetting:
        """The setting searched."""
        return ordered_setting(self.setting)


def plain_number(v: float) -> float | int:
    """``v`` as an int when it is whole (``1065``, not ``1065.0``), as overrides show it."""
    return int(v) if float(v).is_integer() else float(v)


def request_with(base: SettingsRequest, setting: OrderedSetting, value: float) -> SettingsRequest:
    """A ``SettingsRequest``: the job's other settings plus the searched one at ``value``."""
    if setting.name == "sm_clock_mhz":
        return replace(base, sm_clock_mhz=(int(value), int(value)))
    if setting.name == "power_limit_w":
        return replace(base, power_limit_w=float(value))
    return replace(base, clock_offset_mhz=int(value))


def _grid(lo: float, hi: float, step: float, anchor: float) -> list[float]:
    """Values from ``lo`` to ``hi`` on a ``step`` grid through ``anchor`` (both ends included)."""
    k_lo = math.ceil((lo - anchor) / step - 1e-9)
    k_hi = math.floor((hi - anchor) / step + 1e-9)
    vals = {round(anchor + k * step, 6) for k in range(k_lo, k_hi + 1)} | {lo, hi}
    return sorted(v for v in vals if lo <= v <= hi)


def _supported(
    setting: OrderedSetting,
    caps: DeviceCapabilities,
    check: Callable[[SettingsRequest], None],
    base_request: SettingsRequest,
    step: float | None,
    device_label: str,
) -> list[float]:
    """Every value of the setting the device offers, lowest first (the policy not yet applied)."""
    if setting.name == "sm_clock_mhz":
        candidates: list[float] = list(caps.supported_sm_clocks_mhz(base_request.mem_clock_mhz))
    elif setting.name == "power_limit_w":
        lo, hi = float(caps.power_limit_min_w), float(caps.power_limit_default_w)
        candidates = _grid(lo, hi, step or DEFAULT_POWER_STEP_W, hi)
    else:
        if caps.clock_offset_range_mhz is None:
            check(request_with(base_request, setting, 0))  # the guard's own message
            raise UserError(f"{device_label} does not support clock offsets")
        sm = caps.supported_sm_clocks_mhz(base_request.mem_clock_mhz)
        default_step = min((b - a for a, b in zip(sm, sm[1:])), default=15) or 15
        candidates = _grid(0, float(caps.clock_offset_range_mhz[1]), step or default_step, 0)
    if not candidates:
        raise UserError(
            f"{device_label} offers no value of {setting.key} to search "
            f"(a device without settings, such as device=cpu, cannot be searched)"
        )
    return candidates


def _allowed(
    setting: OrderedSetting,
    check: Callable[[SettingsRequest], None],
    base_request: SettingsRequest,
    values: Sequence[float],
) -> list[float | int]:
    """The values the policy allows (``check`` raises ``UserError`` for the others)."""
    allowed = []
    for v in values:
        try:
            check(request_with(base_request, setting, v))
        except UserError:
            continue  # outside the policy
        allowed.append(plain_number(v))
    return allowed


def search_values(
    setting: OrderedSetting,
    caps: DeviceCapabilities,
    check: Callable[[SettingsRequest], None],
    base_request: SettingsRequest,
    *,
    step: float | None = None,
    explicit: Sequence[float] | None = None,
    device_label: str = "the GPU",
) -> tuple[float, ...]:
    """The values one GPU supports for the setting, riskiest first.

    Args:
        setting: what is searched.
        caps: the GPU's ``DeviceCapabilities``.
        check: refuses a ``SettingsRequest`` the GPU or its policy does not allow (raises
            ``UserError``); typically ``Policy.check`` bound to the GPU.
        base_request: the job's other settings (the memory clock changes the SM clock table).
        step: the grid step of a power or offset search (see :class:`SearchOptions`).
        explicit: values the user gave (``device.sm_clock_mhz=range(...)``); each must pass
            ``check``. None: every value the device supports and the policy allows.
        device_label: names the GPU in messages.

    Raises:
        UserError: an explicit value the device does not support, or no value at all.
    """
    if explicit is not None:
        values = sorted({plain_number(v) for v in explicit})
        for v in values:
            check(request_with(base_request, setting, v))
    else:
        candidates = _supported(setting, caps, check, base_request, step, device_label)
        values = _allowed(setting, check, base_request, candidates)
    if not values:
        raise UserError(
            f"no value of {setting.key} is allowed on {device_label} (check device.policy_file)"
        )
    return tuple(values if setting.riskier == "lower" else reversed(values))
