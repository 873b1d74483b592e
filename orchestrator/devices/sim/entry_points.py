"""The simulated NVML's C entry points: what ``_nvmlGetFunctionPointer`` hands a C-style caller.

nvidia-ml-py wraps each NVML C function in Python: it looks the C symbol up
(``_nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2")``), calls it as C is called, with ctypes
arguments (``fn(handle, byref(memory))``), and turns the ``nvmlReturn_t`` it returns into an
exception. A client that needs a call nvidia-ml-py wraps differently does the same itself (nvitop:
the versioned memory, temperature and running-process calls, and field values). So the sim's
entry points take C's arguments and return C's code, as ``libnvidia-ml.so``'s do:

- Each is a ``SimEntryPoint``: called with the C function's arguments (ctypes scalars or plain
  ints for values; ``byref``, ``pointer`` or an array for an out-parameter; ``None`` for NULL), it
  runs the sim's pynvml-style function, writes the answer into the out-parameters, and returns
  ``NVML_SUCCESS`` or the ``NVMLError``'s code; it never raises an ``NVMLError``.
- ``C_SIGNATURES`` gives each C symbol the sim offers: the pynvml-style function that answers it
  and its parameters in C order. In: ``h`` a device handle, ``in`` a value, ``str`` a string,
  ``set`` an event set. Out: ``out`` a scalar, ``buf`` a char buffer and its length, ``struct``,
  ``list`` a count (in: the room, out: how many) and an array, ``dev`` a device handle, ``newset``
  an event set. Several outs take the parts of the function's answer in order.
- Arrays follow NVML's sizing protocol: a count too small for the answer (0 and a NULL array, to
  ask) gets the size and ``NVML_ERROR_INSUFFICIENT_SIZE``, or ``NVML_SUCCESS`` when the answer is
  empty. A string longer than its buffer is ``INSUFFICIENT_SIZE`` too; a NULL out-parameter is
  ``INVALID_ARGUMENT``.
- ``nvmlDeviceGetProcessUtilization`` takes its array before its count; the sim keeps no
  per-process samples, so it answers ``NOT_FOUND`` (no sample newer than the time stamp).
- Structs are filled field by field, by the names of the caller's struct (nvitop declares its own
  ``c_nvmlMemory_v2_t`` and process structs): a field the sim does not answer is left as it was.
  The versioned calls (``nvmlDeviceGetMemoryInfo_v2``, ``nvmlDeviceGetTemperatureV``) read the
  struct's ``version`` first and refuse another with ``ARGUMENT_VERSION_MISMATCH``.
- Handles: a caller holding a handle from the sim's Python calls passes a ``SimHandle``; one that
  got it as C does (``nvmlDeviceGetHandleByIndex_v2``) holds an opaque ``c_nvmlDevice_t`` whose
  address encodes the GPU's index (never dereferenced). Both are accepted; event sets likewise.

A symbol not in ``C_SIGNATURES`` is not offered (``NVMLError_FunctionNotFound`` at lookup, as on a
driver without it). The tests run nvidia-ml-py's own wrapper of every symbol here over the sim
(its lookup pointed at this module) and compare it with the sim's Python answer.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import pynvml as _real

from orchestrator.devices.sim.driver import SimHandle
from orchestrator.devices.sim.health import SimEventSet

NVMLError = _real.NVMLError
SUCCESS = _real.NVML_SUCCESS
INVALID_ARGUMENT = _real.NVML_ERROR_INVALID_ARGUMENT
INSUFFICIENT_SIZE = _real.NVML_ERROR_INSUFFICIENT_SIZE
VERSION_MISMATCH = _real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH

_HANDLE_BASE = 0x51D0_0000  # an opaque device handle's address: this plus the GPU's index
_SET_BASE = 0x51E0_0000  # an opaque event set's address: this plus its number in _event_sets
_event_sets: dict[int, SimEventSet] = {}
_set_numbers = itertools.count(1)
_CArg = type(ctypes.byref(ctypes.c_int()))

# Parameter shapes shared by many calls.
_SCALAR = ("h", "out")
_INDEXED = ("h", "in", "out")
_PAIR = ("h", "out", "out")
_PROCESSES = ("h", "list")

C_SIGNATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "nvmlInit": ("nvmlInit", ()),
    "nvmlInit_v2": ("nvmlInit", ()),
    "nvmlInitWithFlags": ("nvmlInitWithFlags", ("in",)),
    "nvmlShutdown": ("nvmlShutdown", ()),
    "nvmlSystemGetDriverVersion": ("nvmlSystemGetDriverVersion", ("buf",)),
    "nvmlSystemGetNVMLVersion": ("nvmlSystemGetNVMLVersion", ("buf",)),
    "nvmlSystemGetCudaDriverVersion": ("nvmlSystemGetCudaDriverVersion", ("out",)),
    "nvmlSystemGetCudaDriverVersion_v2": ("nvmlSystemGetCudaDriverVersion_v2", ("out",)),
    "nvmlDeviceGetCount": ("nvmlDeviceGetCount", ("out",)),
    "nvmlDeviceGetCount_v2": ("nvmlDeviceGetCount", ("out",)),
    "nvmlDeviceGetHandleByIndex": ("nvmlDeviceGetHandleByIndex", ("in", "dev")),
    "nvmlDeviceGetHandleByIndex_v2": ("nvmlDeviceGetHandleByIndex", ("in", "dev")),
    "nvmlDeviceGetHandleByUUID": ("nvmlDeviceGetHandleByUUID", ("str", "dev")),
    "nvmlDeviceGetHandleByPciBusId": ("nvmlDeviceGetHandleByPciBusId", ("str", "dev")),
    "nvmlDeviceGetHandleByPciBusId_v2": ("nvmlDeviceGetHandleByPciBusId", ("str", "dev")),
    "nvmlDeviceGetName": ("nvmlDeviceGetName", ("h", "buf")),
    "nvmlDeviceGetUUID": ("nvmlDeviceGetUUID", ("h", "buf")),
    "nvmlDeviceGetSerial": ("nvmlDeviceGetSerial", ("h", "buf")),
    **{
        f"nvmlDeviceGetPciInfo{v}": ("nvmlDeviceGetPciInfo", ("h", "struct"))
        for v in ("", "_v2", "_v3")
    },
    **{
        f"nvmlDeviceGet{name}": (f"nvmlDeviceGet{name}", _SCALAR)
        for name in (
            "Index", "MinorNumber", "Architecture", "Brand", "ComputeMode", "PerformanceState",
            "PowerState", "PersistenceMode", "PowerUsage", "EnforcedPowerLimit",
            "PowerManagementLimit", "PowerManagementDefaultLimit", "TotalEnergyConsumption",
            "CurrentClocksEventReasons", "CurrentClocksThrottleReasons", "SupportedEventTypes",
            "FanSpeed", "NumFans", "GpcClkVfOffset", "DisplayActive",
        )
    },
    **{
        f"nvmlDeviceGet{name}": (f"nvmlDeviceGet{name}", _INDEXED)
        for name in ("ClockInfo", "MaxClockInfo", "Temperature", "TemperatureThreshold",
                     "FanSpeed_v2")
    },
    "nvmlDeviceGetDriverModel": ("nvmlDeviceGetDriverModel", _PAIR),
    "nvmlDeviceGetDriverModel_v2": ("nvmlDeviceGetDriverModel_v2", _PAIR),
    "nvmlDeviceGetTotalEccErrors": ("nvmlDeviceGetTotalEccErrors", ("h", "in", "in", "out")),
    **{
        f"nvmlDeviceGet{name}": (f"nvmlDeviceGet{name}", _PAIR)
        for name in ("CudaComputeCapability", "MigMode", "EncoderUtilization",
                     "DecoderUtilization", "EccMode", "PowerManagementLimitConstraints",
                     "GpcClkMinMaxVfOffset")
    },
    "nvmlDeviceGetUtilizationRates": ("nvmlDeviceGetUtilizationRates", ("h", "struct")),
    "nvmlDeviceGetMemoryInfo": ("nvmlDeviceGetMemoryInfo", ("h", "struct")),
    "nvmlDeviceGetC2cModeInfoV": ("nvmlDeviceGetC2cModeInfoV", ("h", "struct")),
    "nvmlDeviceGetSupportedMemoryClocks": ("nvmlDeviceGetSupportedMemoryClocks", ("h", "list")),
    "nvmlDeviceGetSupportedGraphicsClocks": (
        "nvmlDeviceGetSupportedGraphicsClocks", ("h", "in", "list")
    ),
    **{
        f"nvmlDeviceGet{kind}RunningProcesses{v}": (f"nvmlDeviceGet{kind}RunningProcesses{v}",
                                                    _PROCESSES)
        for kind in ("Compute", "Graphics", "MPSCompute") for v in ("", "_v2", "_v3")
    },
    "nvmlDeviceSetGpuLockedClocks": ("nvmlDeviceSetGpuLockedClocks", ("h", "in", "in")),
    "nvmlDeviceSetMemoryLockedClocks": ("nvmlDeviceSetMemoryLockedClocks", ("h", "in", "in")),
    "nvmlDeviceResetGpuLockedClocks": ("nvmlDeviceResetGpuLockedClocks", ("h",)),
    "nvmlDeviceResetMemoryLockedClocks": ("nvmlDeviceResetMemoryLockedClocks", ("h",)),
    "nvmlDeviceSetPowerManagementLimit": ("nvmlDeviceSetPowerManagementLimit", ("h", "in")),
    "nvmlDeviceSetPersistenceMode": ("nvmlDeviceSetPersistenceMode", ("h", "in")),
    "nvmlDeviceSetGpcClkVfOffset": ("nvmlDeviceSetGpcClkVfOffset", ("h", "in")),
    "nvmlEventSetCreate": ("nvmlEventSetCreate", ("newset",)),
    "nvmlDeviceRegisterEvents": ("nvmlDeviceRegisterEvents", ("h", "in", "set")),
    "nvmlEventSetWait": ("nvmlEventSetWait", ("set", "struct", "in")),
    "nvmlEventSetWait_v2": ("nvmlEventSetWait_v2", ("set", "struct", "in")),
    "nvmlEventSetFree": ("nvmlEventSetFree", ("set",)),
}
_SPECIAL = ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetFieldValues",
            "nvmlDeviceGetProcessUtilization", "nvmlErrorString")


class SimEntryPoint:
    """One C entry point of the simulated library: call it as C calls it (module docstring).

    ``restype`` and ``argtypes`` are there for callers that set them, as on a ctypes function
    (nvidia-ml-py sets ``restype`` before calling ``nvmlErrorString``); they change nothing.
    """

    def __init__(self, symbol: str, call: Callable[..., Any]) -> None:
        self.__name__ = symbol
        self._call = call
        self.restype: Any = ctypes.c_int
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        """Call the entry point with C's arguments; its ``nvmlReturn_t`` code."""
        try:
            return self._call(*args)
        except NVMLError as e:
            return int(e.value)

    def __repr__(self) -> str:
        return f"<simulated NVML entry point {self.__name__}>"


def entry_point(symbol: str, functions: Mapping[str, Any]) -> SimEntryPoint | None:
    """The entry point for C symbol ``symbol`` over the sim's pynvml-style ``functions`` (the
    ``nvml`` module's namespace); None where the sim does not offer that symbol."""
    if symbol in _SPECIAL:
        return SimEntryPoint(symbol, _special(symbol, functions))
    if symbol not in C_SIGNATURES:
        return None
    name, kinds = C_SIGNATURES[symbol]
    return SimEntryPoint(symbol, _generic(functions[name], kinds))


# --- reading C arguments ----------------------------------------------------------------------
def _target(arg: Any) -> Any:
    """What an out-parameter points at (``byref(x)``, ``pointer(x)``, or an array passed bare).

    Raises:
        NVMLError_InvalidArgument: a NULL pointer.
    """
    if arg is None:
        raise NVMLError(INVALID_ARGUMENT)
    if isinstance(arg, _CArg):
        return arg._obj
    if isinstance(arg, ctypes._Pointer):
        return arg.contents
    return arg


def _value(arg: Any) -> Any:
    return getattr(arg, "value", arg)


def _address(arg: Any) -> int | None:
    if isinstance(arg, int):
        return arg
    if isinstance(arg, (ctypes._Pointer, ctypes.c_void_p)):
        return ctypes.cast(arg, ctypes.c_void_p).value
    return None


def _device(arg: Any) -> SimHandle:
    """A ``SimHandle`` from either kind of handle; a handle that encodes no GPU index gets one
    out of range, which the call refuses as NVML refuses a bad handle (``INVALID_ARGUMENT``)."""
    if isinstance(arg, SimHandle):
        return arg
    address = _address(arg)
    return SimHandle(-1 if address is None else address - _HANDLE_BASE)


def _event_set(arg: Any) -> SimEventSet:
    if isinstance(arg, SimEventSet):
        return arg
    found = _event_sets.get((_address(arg) or 0) - _SET_BASE)
    if found is None:
        raise NVMLError(INVALID_ARGUMENT)
    return found


def _opaque(address: int) -> Any:
    """An opaque ``c_nvmlDevice_t`` at ``address`` (a handle, never dereferenced)."""
    return ctypes.cast(ctypes.c_void_p(address), _real.c_nvmlDevice_t)


# --- writing the answer -----------------------------------------------------------------------
def _put_pointer(target: Any, address: int) -> None:
    ctypes.c_void_p.from_address(ctypes.addressof(target)).value = address


def _fill(dst: Any, src: Any) -> None:
    """Copy ``src``'s answer into the caller's struct ``dst``, by ``dst``'s field names."""
    for field in dst._fields_:
        name = field[0]
        if not hasattr(src, name):
            continue
        value = getattr(src, name)
        if isinstance(value, SimHandle):
            value = _opaque(_HANDLE_BASE + value.index)
        setattr(dst, name, value)


def _write_text(text: Any, buffer: Any, length: Any) -> int:
    data = text if isinstance(text, bytes) else str(text).encode()
    if len(data) + 1 > int(_value(length)):
        return INSUFFICIENT_SIZE
    ctypes.memmove(ctypes.addressof(_target(buffer)), data + b"\0", len(data) + 1)
    return SUCCESS


def _write_list(items: list[Any], count: Any, array: Any) -> int:
    counter = _target(count)
    room, counter.value = int(counter.value), len(items)
    if room < len(items):
        return INSUFFICIENT_SIZE
    if not items:
        return SUCCESS
    elements = _target(array)
    for k, item in enumerate(items):
        if isinstance(item, int):
            elements[k] = item
        else:
            _fill(elements[k], item)
    return SUCCESS


def _write(kind: str, answer: Any, where: tuple[Any, ...]) -> int:
    if kind == "buf":
        return _write_text(answer, *where)
    if kind == "list":
        return _write_list(list(answer), *where)
    target = _target(where[0])
    if kind == "out":
        target.value = int(answer)
    elif kind == "struct":
        _fill(target, answer)
    elif kind == "dev":
        _put_pointer(target, _HANDLE_BASE + answer.index)
    else:  # "newset"
        number = next(_set_numbers)
        _event_sets[number] = answer
        _put_pointer(target, _SET_BASE + number)
    return SUCCESS


_TAKES_TWO = frozenset({"buf", "list"})
_READERS = {"h": _device, "in": _value, "str": _value, "set": _event_set}


def _generic(fn: Callable[..., Any], kinds: tuple[str, ...]) -> Callable[..., int]:
    """A C-style call of ``fn`` whose C parameters are ``kinds`` (see ``C_SIGNATURES``)."""
    arity = sum(2 if k in _TAKES_TWO else 1 for k in kinds)

    def call(*args: Any) -> int:
        if len(args) != arity:
            return INVALID_ARGUMENT
        ins, outs, rest = [], [], iter(args)
        for kind in kinds:
            if kind in _READERS:
                ins.append(_READERS[kind](next(rest)))
            else:
                where = (next(rest), next(rest)) if kind in _TAKES_TWO else (next(rest),)
                if where[0] is None:
                    return INVALID_ARGUMENT
                outs.append((kind, where))
        answer = fn(*ins)
        parts = [answer] if len(outs) == 1 else list(answer or ())
        code = SUCCESS
        for (kind, where), part in zip(outs, parts):
            code = _write(kind, part, where) or code
        return code

    return call


def _special(symbol: str, functions: Mapping[str, Any]) -> Callable[..., Any]:
    """The entry points whose C parameters carry their own inputs (versioned structs, field
    requests) or that return something other than a code (``nvmlErrorString``)."""

    def memory_v2(device: Any, memory: Any) -> int:
        dst = _target(memory)
        if dst.version != _real.nvmlMemory_v2:
            return VERSION_MISMATCH
        _fill(dst, functions["nvmlDeviceGetMemoryInfo"](_device(device), version=dst.version))
        return SUCCESS

    def temperature_v(device: Any, temperature: Any) -> int:
        dst = _target(temperature)
        if dst.version != _real.nvmlTemperature_v1:
            return VERSION_MISMATCH
        dst.temperature = functions["nvmlDeviceGetTemperatureV"](_device(device), dst.sensorType)
        return SUCCESS

    def field_values(device: Any, count: Any, values: Any) -> int:
        n, requests = int(_value(count)), _target(values)
        asked = [(requests[k].fieldId, requests[k].scopeId) for k in range(n)]
        for k, answer in enumerate(functions["nvmlDeviceGetFieldValues"](_device(device), asked)):
            _fill(requests[k], answer)
        return SUCCESS

    def process_utilization(device: Any, samples: Any, count: Any, since: Any) -> int:
        answer = functions["nvmlDeviceGetProcessUtilization"](_device(device), int(_value(since)))
        return _write_list(list(answer), count, samples)

    def error_string(result: Any) -> bytes:
        return str(functions["nvmlErrorString"](int(_value(result)))).encode()

    return {
        "nvmlDeviceGetMemoryInfo_v2": memory_v2,
        "nvmlDeviceGetTemperatureV": temperature_v,
        "nvmlDeviceGetFieldValues": field_values,
        "nvmlDeviceGetProcessUtilization": process_utilization,
        "nvmlErrorString": error_string,
    }[symbol]
