"""Benchmark what starting the ray_gpus launcher's workers costs, and what a Ray runtime env adds.

A sweep on Ray starts one worker (a Ray actor, a process of its own) per GPU, and starts it again
whenever its predecessor dies. Three ways, each in rounds of ``--gpus`` actors on one local Ray
instance with that many logical GPUs, started together and ended before the next round:

- ``pool``: the launcher's own ``GpuPool.start`` over a simulated machine of ``--gpus`` GPUs
  (spawn, then each worker's ``identify``), as ``dvfs sweep -m`` runs it;
- ``bare, env as argument``: an actor that does nothing but set the variables it is handed in
  its constructor (what ``GpuWorker`` does with the driver's ``env``);
- ``bare, env as runtime_env``: the same actor given the same variables as Ray's
  ``runtime_env={"env_vars": ...}``, which the launcher used before: such a worker starts
  through Ray's ``setup_worker.py``, a second Python start that imports Ray before it execs the
  worker.

Ray is started as the launcher starts a local instance: with no idle workers started ahead
(``pool.PRESTART_ENV``), so every actor of every way starts a process of its own.

The ways take turns within each round, each first in turn. Figures, per way: ``ready_s``, from the
first ``.remote()`` of a round until every actor has answered (median over rounds); ``actor
cpu_s``, the CPU time each actor's process used up to then (``/proc/<pid>/stat``, user + system; a
process ``exec``\\ s in place, so a runtime env's ``setup_worker.py`` counts in the worker it
becomes); ``Ray cpu_s``, what Ray's own processes (raylet, GCS, agents) used meanwhile, per actor
(the runtime env agent works for every actor with a runtime env); ``total``, the two. The last line
is the ratio of the two bare ways. Nothing of the package is replaced: ``pool`` is the class a
sweep uses.

Run: ``.venv/bin/python scripts/bench_pool_start.py`` (about a minute on 2 cores); ``--gpus``,
``--rounds`` (default 6).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENV = {"DVFS_BENCH_A": "1", "DVFS_BENCH_B": "2"}


class Bare:
    """An actor that sets the variables it is handed, and says which process it is."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        os.environ.update(env or {})

    def pid(self) -> int:
        """This actor's process id."""
        return os.getpid()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ray_daemons_cpu_s() -> dict[int, float]:
    """CPU seconds of each of Ray's own processes below this one (raylet, GCS, agents; no
    workers)."""
    from orchestrator.testing.chaos_watch import cmdline, descendants

    used = {}
    for pid in descendants(os.getpid()):
        if "default_worker" not in cmdline(pid) and "setup_worker" not in cmdline(pid):
            try:
                used[pid] = cpu_s(pid)
            except OSError:  # ended meanwhile
                pass
    return used


def cpu_since(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two ``ray_daemons_cpu_s`` (a process new since counts whole)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def bare_round(gpus: int, runtime_env: bool) -> tuple[float, list[float]]:
    """Start ``gpus`` bare actors, one GPU each; until all answered (s), and each one's CPU-s."""
    import ray

    cls = ray.remote(Bare)
    start = time.perf_counter()
    if runtime_env:
        actors = [cls.options(num_gpus=1, num_cpus=0, runtime_env={"env_vars": ENV}).remote()
                  for _ in range(gpus)]
    else:
        actors = [cls.options(num_gpus=1, num_cpus=0).remote(ENV) for _ in range(gpus)]
    pids = ray.get([a.pid.remote() for a in actors])
    ready = time.perf_counter() - start
    cpus = [cpu_s(p) for p in pids]
    for a in actors:
        ray.kill(a)
    return ready, cpus


def pool_round(gpus: int, state: Path) -> tuple[float, list[float]]:
    """Start the launcher's pool over the simulated machine at ``state``; as ``bare_round``."""
    from orchestrator.launching.pool import GpuPool
    from orchestrator.launching.settings import LaunchSettings

    pool = GpuPool(LaunchSettings(progress=False), {"backend": "sim", "count": gpus,
                                                   "state_dir": str(state)}, [None])
    start = time.perf_counter()
    pool.start(lambda line: None)
    ready = time.perf_counter() - start
    cpus = [cpu_s(s.info.pid) for s in pool.slots]
    pool.close()
    return ready, cpus


def main(argv: list[str] | None = None) -> int:
    """Run every way in turn for each round, then print the table and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=4, help="logical GPUs, actors a round")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)

    import ray

    from orchestrator.devices import open_backend
    from orchestrator.launching.pool import PRESTART_ENV

    with tempfile.TemporaryDirectory(prefix="dvfs-bench-pool-") as tmp:
        state = Path(tmp) / "sim"
        os.environ["DVFS_SIM_STATE_DIR"] = str(state)
        open_backend({"backend": "sim", "count": args.gpus}).close()
        os.environ[PRESTART_ENV] = "0"  # as the launcher's own local instance
        # its own instance, even where RAY_ADDRESS (as a process that ran Ray leaves it) names one
        ray.init(address="local", num_cpus=2, num_gpus=args.gpus, include_dashboard=False,
                 log_to_driver=False)
        try:
            ways = {
                "pool": lambda: pool_round(args.gpus, state),
                "bare, env as argument": lambda: bare_round(args.gpus, runtime_env=False),
                "bare, env as runtime_env": lambda: bare_round(args.gpus, runtime_env=True),
            }
            samples: dict[str, tuple[list[float], list[float], list[float]]] = {
                name: ([], [], []) for name in ways}
            names = list(ways)
            for r in range(args.rounds):
                for name in names[r % 3:] + names[:r % 3]:  # each way first in turn
                    run = ways[name]
                    before = ray_daemons_cpu_s()
                    ready, cpus = run()
                    time.sleep(1.0)  # the ended actors exit before the next way starts
                    readies, actor_cpus, daemon_cpus = samples[name]
                    readies.append(ready)
                    actor_cpus.extend(cpus)
                    daemon_cpus.append(cpu_since(before, ray_daemons_cpu_s()) / args.gpus)
            print(f"{args.gpus} actors a round, {args.rounds} rounds, local Ray, "
                  f"{os.cpu_count()} cores")
            print(f"{'way':<26} {'ready_s':>8} {'actor cpu_s':>12} {'Ray cpu_s':>10} {'total':>6}")
            results: dict[str, tuple[float, float]] = {}
            for name, (readies, actor_cpus, daemon_cpus) in samples.items():
                actor, daemons = statistics.mean(actor_cpus), statistics.mean(daemon_cpus)
                results[name] = (statistics.median(readies), actor + daemons)
                print(f"{name:<26} {results[name][0]:>8.2f} {actor:>12.2f} {daemons:>10.2f} "
                      f"{actor + daemons:>6.2f}")
        finally:
            ray.shutdown()
    arg, env = results["bare, env as argument"], results["bare, env as runtime_env"]
    print(f"runtime_env / argument: ready {env[0] / arg[0]:.2f}x, CPU {env[1] / arg[1]:.2f}x "
          f"(+{env[1] - arg[1]:.2f} CPU-s an actor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
