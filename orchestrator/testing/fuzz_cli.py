"""CLI fuzz: odd overrides typed through ``dvfs sweep``, as a user types them; then the ledger.

Each input is one to three overrides of a real key (every field of the schema, the launcher's and
the sweeper's keys, the path keys) with an odd value: empty, huge, negative, NaN, infinite, a
boolean where a path goes, a config group's option name, an interpolation (``${now:%Y}``), a
list, unicode, sweep syntax. Each runs as ``dvfs sweep workload.size=tiny ...`` on a simulated
GPU, in a child process that runs inputs one after another (``orchestrator.cli.main``, as the
console script does), with ``hydra.sweeper.max_hours`` at :data:`MAX_HOURS`: an input is either
refused (exit 2, one line), or accepted and over within its bound (the estimate is under
``MAX_HOURS``, so :data:`LIMIT_S` is ample). The ledger counts, and the targets are 0 of each:

- **tracebacks**: an exit code other than 0 and 2, a ``Traceback`` or more than one line on stderr
  for a refusal;
- **hangs**: an input still running after :data:`LIMIT_S` (its child is killed and replaced);
- **GPUs left changed**: a simulated GPU not at its defaults, or a journal entry, at the end.

    .venv/bin/python scripts/fuzz_cli.py --inputs 1000 --seed 31     # the full run
    .venv/bin/python scripts/fuzz_cli.py --inputs 40 --seed 1         # the short form (a test)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

MAX_HOURS = 0.01  # 36 s: a longer sweep is refused by the duration gate, as a long one would be
LIMIT_S = 240.0  # an accepted input runs one trial of at most MAX_HOURS, plus a kernel's build
CHILDREN = 2

KEYS = [
    "measure.window_s", "measure.min_iters", "measure.max_iters", "measure.warmup_iters",
    "measure.settle_s", "measure.repeats", "measure.reference_samples", "measure.check_iters",
    "measure.counter_edge_wait_s", "measure.poll_hz", "measure.min_counter_updates",
    "measure.clock_tolerance_mhz", "measure.timeout_s", "measure.digest", "measure.meter",
    "device.sm_clock_mhz", "device.mem_clock_mhz", "device.power_limit_w",
    "device.clock_offset_mhz", "device.count", "device.seed", "device.energy_update_period_s",
    "device.gpus", "device.journal_dir", "device.policy_file", "device.state_dir",
    "device.powercap_root", "device.profile", "device.planted_thresholds", "seed", "store_dir",
    "objective", "quiet", "workload.dtype", "framework.precision", "hydra.sweeper.max_hours",
]
ODD = [
    "", "''", "' '", "true", "false", "null", "0", "-1", "1", "2", "nan", "inf", "-inf", "1e9",
    "999999999999", "-999999999999", "2147483648", "18446744073709551616", "0.5", "3600",
    "3601", "86401", "${now:%Y}", "${now:%H}", "${oops}", "${measure.window_s}", "quick",
    "default", "gemm", "sim", "jax", "quickstart", "[1,2]", "[]", "[1410,210]", "{a: 1}",
    "日本", "a b", "'unterminated", "\\", "??", "1,2", "range(1,3)", "/", ".", "./rel/dir",
    "/nonexistent/x", "1e-9", "0.001", "1065", "250", "100",
]


PLAUSIBLE = ["1", "2", "0.5", "0.1", "10", "1065", "250", "0", "true", "null"]
"""Values many keys accept: a third of the values, so that inputs are also accepted and run."""


def inputs(n: int, seed: int) -> list[list[str]]:
    """``n`` inputs, each one to three ``key=value`` overrides, seeded."""
    rng = random.Random(seed)

    def value() -> str:
        return rng.choice(PLAUSIBLE) if rng.random() < 1 / 3 else rng.choice(ODD)

    return [[f"{rng.choice(KEYS)}={value()}" for _ in range(rng.randint(1, 3))]
            for _ in range(n)]


# --- a child: runs inputs one after another -------------------------------------------------------
def child(state: Path, work: Path) -> None:
    """Read one JSON input per stdin line; run it; answer one JSON line on the real stdout."""
    from orchestrator.cli import main

    answer = os.fdopen(os.dup(1), "w")
    for i, line in enumerate(sys.stdin):
        args = json.loads(line)
        out, err = work / f"{i}.out", work / f"{i}.err"
        with open(out, "w") as o, open(err, "w") as e:
            saved = os.dup(1), os.dup(2)
            os.dup2(o.fileno(), 1)
            os.dup2(e.fileno(), 2)
            t0 = time.monotonic()
            try:
                rc = main(["sweep", "workload.size=tiny", "measure=quick",
                           f"hydra.run.dir={work / 'run' / str(i)}",
                           f"hydra.sweeper.max_hours={MAX_HOURS}", *args])
            except SystemExit as x:
                rc = x.code if isinstance(x.code, int) else 1
            except BaseException:  # noqa: BLE001 - the fuzz records it: a traceback
                import traceback

                traceback.print_exc()
                rc = -1
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
        answer.write(json.dumps({"rc": rc, "s": time.monotonic() - t0,
                                 "stderr": err.read_text(errors="replace")[-4000:]}) + "\n")
        answer.flush()
        out.unlink()
        err.unlink()


class Child:
    """A child process (:func:`child`) and a watchdog on its current input."""

    def __init__(self, root: Path, n: int) -> None:
        self.state = root / f"sim{n}"
        self.work = root / f"work{n}"
        self.work.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, DVFS_SIM_STATE_DIR=str(self.state))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.testing.fuzz_cli", "--child", str(self.state),
             str(self.work)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=self.work,
            start_new_session=True)

    def run(self, args: list[str]) -> dict[str, Any]:
        """Run one input; a hang (past LIMIT_S) kills the child and says so."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        timer = threading.Timer(LIMIT_S, self.kill)
        timer.start()
        line = self.proc.stdout.readline()
        timer.cancel()
        if not line:
            return {"rc": None, "s": LIMIT_S, "stderr": "", "hang": True}
        return json.loads(line)

    def kill(self) -> None:
        """End the child and everything it started."""
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """End the child after its last input."""
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()


def verdict(args: list[str], r: dict[str, Any]) -> str:
    """``accepted``, ``refused`` or what went wrong: ``hang``, ``traceback``, ``past bound``."""
    if r.get("hang"):
        return "hang"
    lines = [ln for ln in r["stderr"].splitlines() if ln.strip()]
    if "Traceback" in r["stderr"] or r["rc"] not in (0, 2):
        return "traceback"
    if r["rc"] == 2:
        errors = [ln for ln in lines if "error:" in ln]
        return "refused" if len(errors) == 1 and errors[-1] == lines[-1] else "traceback"
    return "past bound" if r["s"] > LIMIT_S else "accepted"


def left_changed(root: Path) -> list[str]:
    """Every simulated GPU not at its defaults, and every journal entry, of every child."""
    from orchestrator.devices.sim.state import Machine

    found = []
    for spec in sorted(root.rglob("machine.json")):  # device.state_dir may have moved one
        state = spec.parent
        where = state.relative_to(root)
        found += [f"{where}: {g}" for g in Machine(state).changed()]
        found += [f"{where}: journal {p.stem}" for p in (state / "journal").glob("*.json")]
    return found


def fuzz(n: int, seed: int, root: Path) -> dict[str, Any]:
    """Run ``n`` inputs over :data:`CHILDREN` children; the ledger."""
    todo = list(enumerate(inputs(n, seed)))
    results: list[dict[str, Any]] = [{} for _ in todo]
    lock = threading.Lock()
    t0 = time.monotonic()

    def lane(k: int) -> None:
        worker = Child(root, k)
        while True:
            with lock:
                if not todo:
                    break
                i, args = todo.pop(0)
            r = worker.run(args)
            r["args"], r["verdict"] = args, verdict(args, r)
            results[i] = r
            if r.get("hang"):
                worker = Child(root, k)
            done = sum(1 for x in results if x)
            if done % 50 == 0:
                print(f"fuzz: {done}/{n} inputs, {time.monotonic() - t0:.0f} s", flush=True)
        worker.close()

    lanes = [threading.Thread(target=lane, args=(k,)) for k in range(CHILDREN)]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    counts = Counter(r["verdict"] for r in results)
    bad = [r for r in results if r["verdict"] not in ("accepted", "refused")]
    return {"inputs": n, "seed": seed, "seconds": round(time.monotonic() - t0, 1),
            "verdicts": dict(counts), "bad": bad, "gpus_left_changed": left_changed(root),
            "slowest_accepted_s": max((r["s"] for r in results if r["verdict"] == "accepted"),
                                      default=0.0)}


def summary(result: dict[str, Any]) -> str:
    """The ledger in a few lines."""
    v = result["verdicts"]
    lines = [
        f"fuzz: {result['inputs']} inputs (seed {result['seed']}) in {result['seconds']} s: "
        f"{v.get('refused', 0)} refused in one line (exit 2), {v.get('accepted', 0)} accepted "
        f"and ran (slowest {result['slowest_accepted_s']:.1f} s)",
        f"  tracebacks {v.get('traceback', 0)} | hangs {v.get('hang', 0)} | runs past their "
        f"bound {v.get('past bound', 0)} | GPUs left changed {len(result['gpus_left_changed'])}",
    ]
    for r in result["bad"][:10]:
        lines.append(f"  {r['verdict']}: {' '.join(r['args'])}: {r['stderr'][-300:]!r}")
    for g in result["gpus_left_changed"][:10]:
        lines.append(f"  left changed: {g}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the fuzz; exit 0 when every target is met."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--child":
        child(Path(args[1]), Path(args[2]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, default=1000, help="how many inputs (default 1000)")
    p.add_argument("--seed", type=int, default=31, help="seeds the inputs")
    p.add_argument("--dir", type=Path, help="work here (default: a new temporary directory)")
    p.add_argument("--json", type=Path, help="also write the full result here")
    o = p.parse_args(args)
    root = o.dir or Path(tempfile.mkdtemp(prefix="dvfs-fuzz-"))
    result = fuzz(o.inputs, o.seed, root)
    print(summary(result))
    if o.json:
        o.json.write_text(json.dumps(result, indent=1))
    v = result["verdicts"]
    ok = not (v.get("traceback") or v.get("hang") or v.get("past bound")
              or result["gpus_left_changed"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
