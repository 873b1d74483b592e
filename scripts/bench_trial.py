#!/usr/bin/env python
"""What a real trial costs beside its window: each phase's seconds and the bytes it copied to the
host, per workload and framework, on a device whose clock is real.

The simulated GPU cannot show this: its window is virtual time, and it computes a small problem
while charging a GPU-sized one, so host work never shows. Here every trial runs for real, on
``device=cpu`` (the host measured as a device, wall time) or ``device=nvml`` (an NVIDIA GPU,
observe-only: nothing is set), at the largest size preset this machine can hold and compute in a
sensible time (``cpu``; ``--preset gpu`` on a GPU). For each workload x framework it runs the
same trial twice: the first builds (compiles) the kernel and computes the float64 reference, as
the first trial of a sweep on each GPU does; the second costs what every further trial of a sweep
costs, and its row is the one printed and judged. Targets (issue 28):

- the comparison with the reference takes at most 5 % of the window;
- at most 1 MiB reaches the host per trial, whatever the output's size (fingerprints, and four
  numbers per compared output);
- the trial's wall time is at most 1.15 x (window + check run) + 0.5 s.

Usage::

    .venv/bin/python scripts/bench_trial.py [--device cpu] [--preset cpu] [--window-s 1]
        [--workloads gemm stencil] [--frameworks jax tensorflow] [--json rows.json]

It prints a markdown table and exits 1 when a pair misses a target or fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orchestrator.measuring.phases import PHASES

MAX_COMPARE_SHARE = 0.05  # of the window
MAX_HOST_BYTES = 1 << 20  # per trial
WALL_FACTOR, WALL_SLACK_S = 1.15, 0.5  # wall <= 1.15 x (window + check run) + 0.5 s
OTHER = ("build", "settings", "warmup", "edge_wait", "restore")  # neither window, check nor compare


def trial_overrides(workload: str, framework: str, args: argparse.Namespace) -> list[str]:
    """The trial a pair runs: default measurement, except the window's length."""
    overrides = [f"device={args.device}", f"workload={workload}", f"framework={framework}",
                 f"workload.size={args.preset}", f"measure.window_s={args.window_s}", "quiet=true"]
    if args.device == "nvml":
        overrides.append("device.observe_only=true")
    if args.precision:
        overrides.append(f"framework.precision={args.precision}")
    return overrides


def _trial(ctx: Any, cfg: Any) -> dict[str, Any]:
    from orchestrator.jobs.job import JobSpec
    from orchestrator.measuring.trial import run_trial

    (row,) = run_trial(ctx, JobSpec.from_config(cfg))
    if row["status"] in ("crash", "timeout", "device_error", "not_measured", "out_of_memory"):
        raise RuntimeError(f"trial {row['status']}: {row.get('error')}")
    return row


def judge(row: dict[str, Any]) -> dict[str, Any]:
    """A steady trial's phases against the targets."""
    seconds = {name: row.get(f"phase_{name}_s") or 0.0 for name in PHASES}
    physical = seconds["window"] + seconds["check_run"]
    wall = row["wall_s"]
    return {
        **{f"{name}_s": s for name, s in seconds.items()},
        "wall_s": wall,
        "other_s": sum(seconds[name] for name in OTHER),
        "compare_share": seconds["compare"] / seconds["window"] if seconds["window"] else None,
        "wall_target_s": WALL_FACTOR * physical + WALL_SLACK_S,
        "bytes_to_host": row["bytes_to_host"],
        "output_bytes": row.get("output_bytes"),
        "status": row["status"],
        "iterations": row["iterations"],
        "checked_iters": row["checked_iters"],
    }


def meets_targets(result: dict[str, Any]) -> bool:
    """Whether a judged pair meets all three targets."""
    share = result["compare_share"]
    return (
        share is not None and share <= MAX_COMPARE_SHARE
        and result["bytes_to_host"] <= MAX_HOST_BYTES
        and result["wall_s"] <= result["wall_target_s"]
    )


def bench_pair(workload: str, framework: str, args: argparse.Namespace, session: Any) -> dict:
    """Two trials of one workload x framework: the first's build and reference, the second's
    phases judged."""
    from kernels import KernelOptions
    from orchestrator.config import compose

    cfg = compose(trial_overrides(workload, framework, args))
    ctx = session.context(cfg.device)
    first = _trial(ctx, cfg)
    steady = _trial(ctx, cfg)
    preset = steady.get("size") or args.preset  # what workload.size=auto chose
    kernel = ctx.kernels.get(KernelOptions(workload, framework=framework, preset=preset,
                                           precision=cfg.framework.precision))
    steady["output_bytes"] = kernel.output_bytes
    result = judge(steady)
    result.update(workload=workload, framework=framework, preset=preset,
                  device=steady["device_name"], first_build_s=first.get("phase_build_s"),
                  first_compare_s=first.get("phase_compare_s"),
                  reference_builds=kernel.reference_builds,
                  footprint_bytes=steady.get("footprint_bytes"),
                  host_peak_bytes=max(first.get("host_peak_bytes") or 0,
                                      steady.get("host_peak_bytes") or 0) or None,
                  device_in_use_after_bytes=ctx.device.memory_used_bytes(),
                  host_rss_after_bytes=_rss_bytes(), check_arithmetic=steady.get(
                      "check_arithmetic"), rel_error=steady.get("rel_error"),
                  rows=[first, steady])
    result["meets_targets"] = meets_targets(result)
    return result


def _rss_bytes() -> int | None:
    """This process's resident memory now (``VmRSS``), None where ``/proc`` does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def memory_markdown(results: list[dict[str, Any]]) -> str:
    """One line per pair, in the order they ran in one process: the size chosen, the trial's
    footprint, the device memory in use and the host's resident memory after the pair, the
    host's peak during it, and the check's arithmetic and status."""
    lines = ["| workload | size | footprint GiB | device in use after GiB | host peak GiB | "
             "host RSS after GiB | arithmetic | rel. error | checks |",
             "|---|---|---:|---:|---:|---:|---|---:|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['workload']} | failed: {r['error'][:200]} | | | | | | | |")
            continue
        err = r.get("rel_error")
        lines.append(
            f"| {r['workload']} | {r['preset']} | {_gib(r.get('footprint_bytes'))} | "
            f"{_gib(r.get('device_in_use_after_bytes'))} | {_gib(r.get('host_peak_bytes'))} | "
            f"{_gib(r.get('host_rss_after_bytes'))} | {r.get('check_arithmetic')} | "
            f"{'-' if err is None else f'{err:.2e}'} | {r['status']} |")
    return "\n".join(lines)


def markdown(results: list[dict[str, Any]]) -> str:
    """One line per pair: the steady trial's phases, its wall time against the target, the
    comparison's share of the window, the bytes it copied to the host."""
    lines = [
        "| workload | framework | output MiB | window s | check run s | compare s | other s | "
        "wall s | wall target s | compare / window | bytes to host | first trial: build s, "
        "reference + compare s | checks | targets |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['workload']} | {r['framework']} | failed: {r['error']} |"
                         + " |" * 11)
            continue
        lines.append(
            f"| {r['workload']} | {r['framework']} | {_mib(r['output_bytes'])} | "
            f"{r['window_s']:.2f} | {r['check_run_s']:.2f} | {r['compare_s']:.4f} | "
            f"{r['other_s']:.2f} | {r['wall_s']:.2f} | {r['wall_target_s']:.2f} | "
            f"{r['compare_share']:.2%} | {r['bytes_to_host']:,} | "
            f"{r['first_build_s']:.2f}, {r['first_compare_s']:.2f} | {r['status']} | "
            f"{'met' if r['meets_targets'] else 'MISSED'} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (every workload and framework by default)."""
    from kernels import FRAMEWORKS, list_workloads

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "nvml", "tpu"), default="cpu")
    parser.add_argument("--preset", default="cpu", help="size preset: tiny, cpu, gpu, auto")
    parser.add_argument("--precision", default=None, help="framework.precision (default: as "
                        "the config has it)")
    parser.add_argument("--rows", type=Path, help="write every trial's row here (JSON lines)")
    parser.add_argument("--window-s", type=float, default=1.0, help="window length in seconds")
    parser.add_argument("--workloads", nargs="+", default=list(list_workloads()))
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS))
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 1 when a pair misses a target or failed."""
    from orchestrator.measuring.session import GpuSession

    args = parse_args(argv)
    results = []
    with GpuSession() as session:
        for framework in args.frameworks:
            for workload in args.workloads:
                try:
                    results.append(bench_pair(workload, framework, args, session))
                except Exception as e:  # noqa: BLE001 - one failing pair never stops the others
                    results.append({"workload": workload, "framework": framework,
                                    "error": f"{type(e).__name__}: {e}"})
                r = results[-1]
                if args.rows:  # as each pair finishes: a run cut short keeps what it measured
                    with args.rows.open("a") as f:
                        f.writelines(json.dumps(row, default=str) + "\n"
                                     for row in r.pop("rows", []))
                shown = r.get("error") or (
                    f"{r['preset']}: wall {r['wall_s']:.2f} s of {r['wall_target_s']:.2f}; "
                    f"{r['status']}; device in use {_gib(r['device_in_use_after_bytes'])} GiB, "
                    f"host peak {_gib(r['host_peak_bytes'])} GiB")
                print(f"{workload}/{framework}: {shown}", file=sys.stderr, flush=True)
    print(markdown(results))
    print()
    print(memory_markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0 if all(r.get("meets_targets") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
