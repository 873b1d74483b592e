#!/usr/bin/env python
"""What one call of the simulated NVML costs on the host, in microseconds.

A trial on the simulated GPU accounts every kernel call (``simDeviceRecordKernelCall``: virtual
time, energy, clocks, the fault draw, the GPU's state updated on disk), reads the virtual clock
(``simDeviceGetTimeS``) around its window, and changes a setting (``nvmlDeviceSetGpuLockedClocks``:
a durable write) between trials. This script times each of the three, and the state store alone
(``Machine.update`` with a one-key change, ``Machine.read``), on a fresh one-GPU machine in
a temporary state directory: ``--rounds`` rounds of ``--calls`` calls each, and prints the median
over rounds of the per-call time (one round is the mean of its calls; the median of rounds keeps
a round that the shared machine slowed down from moving the figure). The setter alternates between
two locks so that every call changes the state.

Usage::

    .venv/bin/python scripts/bench_sim_call.py [--rounds 7] [--calls 2000]
        [--profile a100_sxm4_40gb] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.devices.base import KernelWork
from orchestrator.devices.sim import nvml as sim
from orchestrator.devices.sim.state import STATE_ENV, Machine, create_machine


def time_per_call_us(call: Callable[[int], object], calls: int, rounds: int) -> list[float]:
    """Each round's mean time per call, in microseconds (``call`` gets the call's number)."""
    per_round = []
    for _ in range(rounds):
        start = time.perf_counter()
        for k in range(calls):
            call(k)
        per_round.append((time.perf_counter() - start) / calls * 1e6)
    return per_round


def main(argv: list[str] | None = None) -> int:
    """Time each call on a fresh one-GPU sim machine; print the median per call in microseconds."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds per call (median reported)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per round")
    parser.add_argument(
        "--setter-calls", type=int, default=200, help="calls per round of the setter (each syncs)"
    )
    parser.add_argument("--profile", default="a100_sxm4_40gb", help="the simulated GPU's profile")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-sim-") as tmp:
        create_machine(tmp, args.profile)
        os.environ[STATE_ENV] = tmp
        sim.nvmlInit()
        try:
            h = sim.nvmlDeviceGetHandleByIndex(0)
            machine = Machine(tmp)
            work = KernelWork(
                flops=2e9, bytes_moved=4e8, peak="fp32", kernel_class="stencil", framework="jax"
            )
            mem = sim.nvmlDeviceGetSupportedMemoryClocks(h)[0]
            lo = sim.nvmlDeviceGetSupportedGraphicsClocks(h, mem)[-1]
            hi = sim.nvmlDeviceGetMaxClockInfo(h, sim.NVML_CLOCK_SM)
            cases = {
                "simDeviceRecordKernelCall": (
                    lambda k: sim.simDeviceRecordKernelCall(h, work), args.calls
                ),
                "simDeviceGetTimeS": (lambda k: sim.simDeviceGetTimeS(h), args.calls),
                "Machine.update (store alone)": (
                    lambda k: machine.update(0, lambda st: st.update(bench=k)), args.calls
                ),
                "Machine.read (store alone)": (lambda k: machine.read(0), args.calls),
                "nvmlDeviceSetGpuLockedClocks": (
                    lambda k: sim.nvmlDeviceSetGpuLockedClocks(h, lo, hi if k % 2 else lo),
                    args.setter_calls,
                ),
            }
            figures = {}
            for name, (call, calls) in cases.items():
                call(0)  # warm caches and imports outside the timed rounds
                rounds = time_per_call_us(call, calls, args.rounds)
                figures[name] = {
                    "median_us": statistics.median(rounds),
                    "min_us": min(rounds),
                    "max_us": max(rounds),
                    "rounds": len(rounds),
                    "calls_per_round": calls,
                }
            sim.nvmlDeviceResetGpuLockedClocks(h)
        finally:
            sim.nvmlShutdown()

    print(f"simulated {args.profile}, median of {args.rounds} rounds (min-max), per call:")
    for name, f in figures.items():
        print(f"  {name:30s} {f['median_us']:9.1f} us  ({f['min_us']:.1f}-{f['max_us']:.1f})")
    if args.json:
        args.json.write_text(json.dumps({"profile": args.profile, "figures": figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
