#!/usr/bin/env python
"""Benchmark every workload x framework against this machine's own ceilings, measured in the run.

Ceilings: a large NumPy float32 matmul (FLOP/s, the compute roof) and a large NumPy array copy
(bytes read + written per second, the bandwidth roof). Each kernel is built once at the preset
(compile and warm-up outside the timing), then timed with ``call_device`` in loops of at least
``--min-time`` seconds; the best of ``--repeats`` loops counts, since other work on a shared
machine only ever slows a loop down. A compute-bound workload is compared with the matmul rate,
a memory-bound one with the copy bandwidth. The last output is checked against the float64
reference. Output: markdown tables (and ``--json`` rows), the last one the time per call of each
workload in each way side by side.

Ways (``--frameworks``): ``jax``, ``tensorflow`` (``--xla`` for ``jit_compile``), ``pytorch``
(eager, op by op) and ``pytorch-compiled`` (``torch.compile``, Inductor; its compile is part of
the build, outside the timing).

Targets on a CPU: ``gemm`` at least 0.8 of the NumPy matmul rate in both frameworks; the JAX
``stencil`` at least 0.5 of copy bandwidth (one fused pass).

Usage::

    .venv/bin/python scripts/bench_kernels.py [--preset cpu] [--workloads gemm stencil] \
        [--frameworks jax tensorflow pytorch pytorch-compiled]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kernels import KernelOptions, build_kernel, check_outputs, get_spec, list_workloads

TARGETS = {("gemm", "jax"): 0.8, ("gemm", "tensorflow"): 0.8, ("stencil", "jax"): 0.5}
WAYS: dict[str, tuple[str, bool]] = {
    "jax": ("jax", False),
    "tensorflow": ("tensorflow", False),
    "pytorch": ("pytorch", False),
    "pytorch-compiled": ("pytorch", True),
}
"""Each way a kernel is run: its name here -> (framework, torch.compile)."""


def time_call(fn: Callable[[], object], min_time_s: float, repeats: int) -> float:
    """Best seconds per call of ``fn`` over ``repeats`` loops of at least ``min_time_s`` each."""
    best = float("inf")
    for _ in range(repeats):
        calls = 0
        start = time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time_s and calls >= 3:
                break
        best = min(best, elapsed / calls)
    return best


def measure_ceilings(matmul_n: int, copy_elements: int, min_time_s: float, repeats: int) -> dict:
    """NumPy float32 matmul rate (GFLOP/s) and array-copy bandwidth (GB/s, read + write)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((matmul_n, matmul_n), dtype=np.float32)
    b = rng.standard_normal((matmul_n, matmul_n), dtype=np.float32)
    c = np.empty_like(a)
    np.matmul(a, b, out=c)
    t_mm = time_call(lambda: np.matmul(a, b, out=c), min_time_s, repeats)
    src = rng.standard_normal(copy_elements, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t_copy = time_call(lambda: np.copyto(dst, src), min_time_s, repeats)
    return {
        "matmul_n": matmul_n,
        "matmul_gflops": 2.0 * matmul_n**3 / t_mm / 1e9,
        "copy_bytes": 2 * src.nbytes,
        "copy_gbs": 2.0 * src.nbytes / t_copy / 1e9,
    }


def bench_one(name: str, way: str, args: argparse.Namespace, ceilings: dict) -> dict:
    """Build, time and check one kernel run one way (:data:`WAYS`); return its row."""
    spec = get_spec(name)
    framework, compiled = WAYS[way]
    k = build_kernel(KernelOptions(name, framework, args.preset, args.dtype, args.precision,
                                   xla=args.xla, compile=compiled))
    t = time_call(k.call_device, args.min_time, args.repeats)
    out = k.call()
    check = check_outputs([out], k.reference(), k.dtype, k.precision, name)
    gflops = k.counts.flops / t / 1e9
    gbs = k.counts.bytes_moved / t / 1e9
    if spec.compute_bound:
        roof, ratio = "matmul", gflops / ceilings["matmul_gflops"]
    else:
        roof, ratio = "copy", gbs / ceilings["copy_gbs"]
    return {
        **k.describe(),
        "way": way,
        "build_s": k.build_s,
        "time_s": t,
        "gflops": gflops,
        "gbs": gbs,
        "roof": roof,
        "roof_ratio": ratio,
        "verdict": check.verdict.value,
        "rel_error": check.rel_error,
    }


def render(rows: list[dict], ceilings: dict, args: argparse.Namespace) -> str:
    """Markdown: ceilings, one row per kernel and way, the ways' times side by side, targets."""
    lines = [
        f"preset `{args.preset}`, {args.dtype}, precision `{args.precision}`, "
        f"TF XLA {'on' if args.xla else 'off'}; {platform.processor() or platform.machine()}",
        "",
        f"Ceilings: NumPy matmul {ceilings['matmul_n']}^3 float32 "
        f"**{ceilings['matmul_gflops']:.1f} GFLOP/s**; array copy "
        f"{ceilings['copy_bytes'] / 2**20:.0f} MiB read+write **{ceilings['copy_gbs']:.1f} GB/s**",
        "",
        "| workload | framework | size | build s | ms/call | GFLOP/s | GB/s | of roof | check |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['way']} | {r['size']} | {r['build_s']:.2f} | "
            f"{r['time_s'] * 1e3:.3f} | {r['gflops']:.2f} | {r['gbs']:.2f} | "
            f"{r['roof_ratio']:.2f} x {r['roof']} | {r['verdict']} ({r['rel_error']:.1e}) |"
        )
    lines += ["", *side_by_side(rows)]
    by_key = {(r["workload"], r["way"]): r for r in rows}
    if args.preset == "cpu" and args.dtype == "float32":
        lines.append("")
        for (name, framework), goal in TARGETS.items():
            if (name, framework) in by_key:
                got = by_key[(name, framework)]["roof_ratio"]
                mark = "PASS" if got >= goal else "MISS"
                lines.append(f"- {mark}: {name} {framework} {got:.2f} of roof (target >= {goal})")
    return "\n".join(lines)


def side_by_side(rows: list[dict]) -> list[str]:
    """A Markdown table of ms per call, a workload per row and a way per column, each way's time
    also over JAX's where JAX ran."""
    ways = list(dict.fromkeys(r["way"] for r in rows))
    ms = {(r["workload"], r["way"]): r["time_s"] * 1e3 for r in rows}
    lines = ["| workload | " + " | ".join(f"{w} ms/call" for w in ways) + " |",
             "|---|" + "---:|" * len(ways)]
    for name in dict.fromkeys(r["workload"] for r in rows):
        cells = []
        for way in ways:
            t, base = ms.get((name, way)), ms.get((name, "jax"))
            if t is None:
                cells.append("-")
            elif base is None or way == "jax":
                cells.append(f"{t:.3f}")
            else:
                cells.append(f"{t:.3f} ({t / base:.2f}x JAX)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu", choices=("tiny", "cpu", "gpu"))
    p.add_argument("--workloads", nargs="+", default=list(list_workloads()))
    p.add_argument("--frameworks", nargs="+", default=list(WAYS), choices=list(WAYS),
                   help="the ways to run each kernel (pytorch: eager; pytorch-compiled)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--precision", default="default")
    p.add_argument("--xla", action="store_true", help="TensorFlow with jit_compile=True")
    p.add_argument("--min-time", type=float, default=0.25, help="seconds per timed loop")
    p.add_argument("--repeats", type=int, default=7, help="timed loops; the best counts")
    p.add_argument("--matmul-n", type=int, default=2048, help="NumPy matmul ceiling size")
    p.add_argument(
        "--copy-elements",
        type=int,
        default=1 << 24,
        help="float32s copied (default: the footprint of the cpu-preset stencil and selu)",
    )
    p.add_argument("--json", type=Path, help="also write the rows and ceilings here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    args = parse_args(argv)
    for name in args.workloads:
        get_spec(name).validate(args.preset, args.dtype, args.precision)
    ceilings = measure_ceilings(args.matmul_n, args.copy_elements, args.min_time, args.repeats)
    rows = []
    for name in args.workloads:
        for way in args.frameworks:
            rows.append(bench_one(name, way, args, ceilings))
            print(f"# {name} {way}: {rows[-1]['time_s'] * 1e3:.3f} ms", file=sys.stderr)
    print(render(rows, ceilings, args))
    if args.json:
        args.json.write_text(json.dumps({"ceilings": ceilings, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
