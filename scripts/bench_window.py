#!/usr/bin/env python
"""What a trial's window costs on a real-time device: the time per iteration a trial measures
against the bare kernel loop, in the same run.

For every workload x framework at a preset, on ``device=cpu`` (the host, wall time) or
``device=nvml`` (an NVIDIA GPU, observe-only: nothing is set), it runs:

- **trial**: one ``run_trial`` window (``measure.digest=after``, the default: bare calls queued
  asynchronously, counter-aligned ends, the check run after it), and reads its
  ``time_per_iter_s``;
- **bare**: the same built kernel, the same number of calls back to back, one synchronisation at
  the end (the fastest the device can go);
- **host digest**: the loop the window used to run, each call synchronised, copied to the host and
  hashed there (BLAKE2b), for comparison (``measure.digest=host``);
- **inline** (``--inline``): a trial with the fingerprint fused into the timed calls.

Trial and bare loop alternate ``--rounds`` times, each going first in every other round, and
``ratio`` is the median over rounds of trial / bare within each round; the target is at most 1.03
for every pair. On a shared 2-core machine a memory-bound kernel's time drifts by 10-20 % from
round to round (how its fresh output pages fault in), far more than between the two loops of one
round: neither the fastest of each series nor the ratio of their medians would separate the
window's cost from that drift. A second series of the same bare loop, run in the same rounds,
gives ``control_ratio``: how far apart two identical loops land on this machine, the floor under
which ``ratio`` means nothing. The checks' verdict is shown beside the figures: a trial whose
check failed still timed its window. The simulated GPU is not offered: its virtual clock hides
host work, so every ratio would be 1 by construction.

Usage::

    .venv/bin/python scripts/bench_window.py [--device cpu] [--preset cpu] [--window-s 1]
        [--workloads stencil gemm] [--frameworks jax] [--inline] [--json rows.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

TARGET_RATIO = 1.03


def bare_loop_s_per_iter(kernel: Any, calls: int) -> float:
    """``calls`` calls back to back, one synchronisation at the end: seconds per call."""
    start = time.perf_counter()
    out = None
    for _ in range(calls):
        out = kernel.dispatch()
    kernel.sync(out)
    return (time.perf_counter() - start) / calls


def host_digest_s_per_iter(kernel: Any, calls: int, budget_s: float) -> float:
    """The old window loop: every call synchronised, copied to the host and hashed there.

    At most ``calls`` calls, and no more than ``budget_s`` of them once three have run: at the
    ``gpu`` preset one call copies and hashes a GiB (seconds each), and a window's worth of them
    would take many minutes.
    """
    from kernels import output_digest

    start = time.perf_counter()
    done = 0
    while done < calls and (done < 3 or time.perf_counter() - start < budget_s):
        output_digest(kernel.to_numpy(kernel.call_device()))
        done += 1
    return (time.perf_counter() - start) / done


def paired_ratio(series: list[float], bare: list[float]) -> float:
    """The median over rounds of ``series / bare`` within each round (the machine drifts between
    rounds by more than the effect measured; within a round it barely does)."""
    return statistics.median(a / b for a, b in zip(series, bare))


def _trial(ctx: Any, overrides: list[str]) -> dict[str, Any]:
    from orchestrator.config import compose
    from orchestrator.jobs.job import JobSpec
    from orchestrator.measuring.trial import run_trial

    (row,) = run_trial(ctx, JobSpec.from_config(compose(overrides)))
    if row["status"] in ("crash", "timeout", "device_error"):
        raise RuntimeError(f"trial {row['status']}: {row.get('error')}")
    return row  # a failed check (wrong, nondeterministic) still timed its window


def bench_pair(
    workload: str, framework: str, args: argparse.Namespace, session: Any
) -> dict[str, Any]:
    """One workload x framework: the trial's time per iteration against the bare loop's."""
    overrides = [
        f"device={args.device}", f"workload={workload}", f"framework={framework}",
        f"workload.size={args.preset}", f"measure.window_s={args.window_s}", "measure.repeats=1",
        "measure.settle_s=0", "measure.warmup_iters=3", "quiet=true",
        # The check run follows the window, outside it: a short one leaves time for more rounds.
        "measure.check_iters=4",
    ]
    if args.device == "nvml":
        overrides.append("device.observe_only=true")
    from kernels import KernelOptions
    from orchestrator.config import compose

    ctx = session.context(compose(overrides).device)
    trial_s, bare_s, control_s = [], [], []
    row: dict[str, Any] = _trial(ctx, overrides)  # builds (and caches) the kernel
    kernel = ctx.kernels.get(KernelOptions(
        workload, framework=framework, preset=args.preset, dtype="float32",
        precision="default", seed=0, xla=False,
    ))
    for i in range(args.rounds):  # alternate which goes first: drift favours neither
        if i % 2:
            bare_s.append(bare_loop_s_per_iter(kernel, row["iterations"]))
        row = _trial(ctx, overrides)
        trial_s.append(row["time_per_iter_s"])
        if not i % 2:
            bare_s.append(bare_loop_s_per_iter(kernel, row["iterations"]))
        control_s.append(bare_loop_s_per_iter(kernel, row["iterations"]))
    result = {
        "workload": workload, "framework": framework, "preset": args.preset,
        "device": row["device_name"], "iterations": row["iterations"],
        "trial_s_per_iter": statistics.median(trial_s),
        "bare_s_per_iter": statistics.median(bare_s),
        "ratio": paired_ratio(trial_s, bare_s),
        # Two series of the same bare loop: how far apart identical loops land on this machine.
        "control_ratio": paired_ratio(control_s, bare_s),
        "rounds_s": {"trial": trial_s, "bare": bare_s, "control": control_s},
        "status": row["status"], "meter": row["meter"], "energy_note": row.get("energy_note"),
    }
    host_calls = max(3, min(row["iterations"], int(args.window_s / result["bare_s_per_iter"])))
    host_s = host_digest_s_per_iter(kernel, host_calls, args.window_s)
    result["host_digest_s_per_iter"] = host_s
    result["host_digest_ratio"] = host_s / result["bare_s_per_iter"]
    if args.inline:
        inline = _trial(ctx, [*overrides, "measure.digest=inline"])
        result["inline_ratio"] = inline["time_per_iter_s"] / result["bare_s_per_iter"]
    return result


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table for the README: trial and bare time per iteration, their ratio, the old loop's."""
    inline = any("inline_ratio" in r for r in rows)
    head = ("| workload | framework | trial ms/iter | bare ms/iter | trial / bare | "
            "bare / bare (noise) | old host-digest loop / bare | checks |")
    rule = "|---|---|---:|---:|---:|---:|---:|---|"
    if inline:
        head += " inline fingerprint / bare |"
        rule += "---:|"
    lines = [head, rule]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workload']} | {r['framework']} | failed: {r['error']} | | | | | |")
            continue
        line = (
            f"| {r['workload']} | {r['framework']} | {r['trial_s_per_iter'] * 1e3:.3f} | "
            f"{r['bare_s_per_iter'] * 1e3:.3f} | {r['ratio']:.3f} | {r['control_ratio']:.3f} | "
            f"{r['host_digest_ratio']:.2f} | "
            f"{r['status']} |"
        )
        if inline:
            line += f" {r.get('inline_ratio', float('nan')):.2f} |"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 1 when a pair is over the target or failed."""
    from kernels import FRAMEWORKS, list_workloads

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "nvml"), default="cpu")
    parser.add_argument("--preset", default="cpu", help="size preset: tiny, cpu, gpu")
    parser.add_argument("--window-s", type=float, default=1.0, help="window length in seconds")
    parser.add_argument("--rounds", type=int, default=11, help="trial/bare alternations")
    parser.add_argument("--workloads", nargs="+", default=list(list_workloads()))
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS))
    parser.add_argument("--inline", action="store_true", help="also time inline fingerprints")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)

    from orchestrator.measuring.session import GpuSession

    rows = []
    with GpuSession() as session:
        for framework in args.frameworks:
            for workload in args.workloads:
                try:
                    rows.append(bench_pair(workload, framework, args, session))
                except Exception as e:  # noqa: BLE001 - one failing pair never stops the others
                    rows.append({"workload": workload, "framework": framework, "error": str(e)})
                r = rows[-1]
                shown = f"ratio {r['ratio']:.3f}" if "ratio" in r else f"failed: {r['error']}"
                print(f"{workload}/{framework}: {shown}", file=sys.stderr, flush=True)
    print(markdown(rows))
    worst = max((r["ratio"] for r in rows if "ratio" in r), default=float("nan"))
    print(f"\nworst trial/bare ratio {worst:.3f} (target <= {TARGET_RATIO})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    ok = all("ratio" in r and r["ratio"] <= TARGET_RATIO for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
