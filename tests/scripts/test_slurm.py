"""``scripts/slurm/dvfs.sbatch`` under a real Slurm: a one-node cluster on localhost, a sim sweep.

The fixture starts Debian's ``munged``, ``slurmctld`` and ``slurmd`` (as root, with a throwaway
``slurm.conf``: one node, this machine, at 127.0.0.1), and ``sbatch`` runs the batch script
itself. Without Slurm (no binaries, not root) those tests are skipped, saying which is missing;
the script's shell syntax is checked in every case.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm" / "dvfs.sbatch"
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue")
pytestmark = pytest.mark.slow


def test_the_batch_script_is_valid_bash():
    out = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert os.access(SCRIPT, os.X_OK)


def test_the_batch_script_outside_slurm_says_so():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run(["bash", str(SCRIPT), "device=sim"], capture_output=True, text=True,
                         env=env)
    assert out.returncode == 2
    assert "run me with sbatch" in out.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def why_no_slurm() -> str | None:
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return (f"Slurm cannot be started here: {', '.join(missing)} not found (Debian: "
                "apt-get install slurmctld slurmd slurm-client munge; scripts/test installs "
                "them as root)")
    if os.geteuid() != 0:
        return "Slurm cannot be started here: its daemons need root, and this is not root"
    if not Path("/etc/munge/munge.key").exists():
        return "Slurm cannot be started here: no /etc/munge/munge.key (munge's package makes it)"
    return None


def slurm_conf(root: Path) -> Path:
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=dvfstest",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd.log'}",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/builtin",
        "ReturnToService=2",
        "MpiDefault=none",
        "KillWait=60",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
        "",
    ]))
    for d in ("state", "spool"):
        (root / d).mkdir(exist_ok=True)
    return conf


def munge_works() -> bool:
    enc = subprocess.run(["munge", "-n"], capture_output=True)
    return enc.returncode == 0 and subprocess.run(["unmunge"], input=enc.stdout,
                                                  capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node Slurm on localhost; yields the environment its commands need (SLURM_CONF)."""
    why = why_no_slurm()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("slurm")
    conf = slurm_conf(root)
    env = dict(os.environ, SLURM_CONF=str(conf))
    procs = []
    if not munge_works():
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        subprocess.run(["munged", "--force"], check=True, capture_output=True)
    try:
        procs.append(subprocess.Popen(["slurmctld", "-D", "-c", "-i", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        time.sleep(1)
        procs.append(subprocess.Popen(["slurmd", "-D", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 60
        while True:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                                   text=True).stdout.strip()
            if state == "idle":
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                logs = "".join(p.read_text()[-1500:] for p in root.glob("*.log"))
                pytest.fail(f"the one-node Slurm did not come up (sinfo: {state!r}): {logs}")
            time.sleep(0.5)
        yield env, root
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def sbatch(env: dict[str, str], root: Path, name: str, *overrides: str, wait: bool = True,
           sim: Path, port: int) -> tuple[subprocess.CompletedProcess, Path]:
    out = root / f"{name}.out"
    job_env = dict(env, DVFS=str(REPO / ".venv" / "bin" / "dvfs"), DVFS_SIM_PER_NODE="2",
                   DVFS_GPUS_PER_NODE="2", DVFS_RAY_PORT=str(port), DVFS_SIM_ROOT=str(sim))
    cmd = ["sbatch", "--parsable", f"--output={out}", f"--chdir={REPO}", "--nodes=1",
           *(["--wait"] if wait else []), str(SCRIPT), *overrides]
    return subprocess.run(cmd, env=job_env, capture_output=True, text=True, timeout=600), out


def stored(sweep: Path) -> list[tuple[str, str]]:
    """The sweep's stored trials; none while the store's file exists but its table does not yet
    (the driver creates the file, then the table: a poll can fall between the two)."""
    with sqlite3.connect(sweep / "trials.sqlite") as con:
        if not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'trials'").fetchone():
            return []
        return con.execute("SELECT trial_key, status FROM trials").fetchall()


def sim_gpus(state: Path) -> list[dict]:
    from orchestrator.devices.sim.state import Machine

    machine = Machine(state)
    gpus = json.loads((state / "machine.json").read_text())["gpus"]
    return [machine.read(i) for i in range(len(gpus))]


def ray_processes(port: int) -> list[str]:
    """The Ray head (its GCS server) on ``port``, if still running."""
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines()
            if "gcs_server" in line and f"--gcs_server_port={port}" in line]


SWEEP = ["device=sim", "device.count=2", "workload=selu", "framework=jax", "workload.size=tiny",
         "measure=quick", "quiet=true", "hydra.launcher.progress=false"]


def test_a_sim_sweep_runs_end_to_end_under_sbatch(slurm, tmp_path):
    env, root = slurm
    sweep, sim, port = tmp_path / "sweep", tmp_path / "sim", free_port()
    done, out = sbatch(env, root, "sweep", *SWEEP, "device.sm_clock_mhz=1110,1260,1410",
                       f"hydra.sweep.dir={sweep}", sim=sim, port=port)
    log = out.read_text() if out.exists() else ""
    assert done.returncode == 0, done.stderr + log
    rows = stored(sweep)
    assert len(rows) == 3 and len({k for k, _ in rows}) == 3, rows
    assert "1 node(s) joined, 2 GPU(s)" in log
    assert "Ray stopped on 1 node(s); exit code 0" in log
    assert all(g["locked_sm_mhz"] is None for g in sim_gpus(sim / "node-0"))
    assert not ray_processes(port), "a Ray head outlived the job"


def test_scancel_stops_the_sweep_restores_the_gpus_and_keeps_the_trials(slurm, tmp_path):
    env, root = slurm
    sweep, sim, port = tmp_path / "sweep", tmp_path / "sim", free_port()
    started, out = sbatch(env, root, "cancel", *SWEEP, "device.sm_clock_mhz=range(660,1410,15)",
                          "device.inject={hang_s:2,times:null}", f"hydra.sweep.dir={sweep}",
                          wait=False, sim=sim, port=port)
    assert started.returncode == 0, started.stderr
    job = started.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 300
    while not ((sweep / "trials.sqlite").exists() and stored(sweep)):
        assert time.monotonic() < deadline, out.read_text() if out.exists() else "no output"
        time.sleep(1)
    subprocess.run(["scancel", job], env=env, check=True)
    while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True,
                         text=True).stdout.strip():
        assert time.monotonic() < deadline + 120, "the cancelled job did not end"
        time.sleep(1)
    log = out.read_text()
    assert "Ray stopped on 1 node(s)" in log, log
    kept = stored(sweep)
    assert 1 <= len(kept) < 50
    assert all(g["locked_sm_mhz"] is None for g in sim_gpus(sim / "node-0")), log
    assert not ray_processes(port), "a Ray head outlived the cancelled job"


@pytest.mark.parametrize("ray, says", [
    ("/nonexistent/ray", "no ray command at '/nonexistent/ray'"),  # refused before any step
    ("/bin/false", "the Ray head exited on"),  # the head's step ends: a client would wait for ever
])
def test_a_ray_head_that_cannot_start_ends_the_job_at_once_saying_why(slurm, tmp_path, ray, says):
    env, root = slurm
    sweep, sim, port = tmp_path / "sweep", tmp_path / "sim", free_port()
    began = time.monotonic()
    done, out = sbatch(dict(env, RAY=ray), root, f"nohead-{Path(ray).name}-{port}", *SWEEP,
                       "device.sm_clock_mhz=1110", f"hydra.sweep.dir={sweep}", sim=sim, port=port)
    log = out.read_text() if out.exists() else ""
    assert done.returncode != 0 and f"dvfs.sbatch: {says}" in log, done.stderr + log
    assert time.monotonic() - began < 120, "the job waited for a head that had exited"  # was: 600+
    assert not (sweep / "trials.sqlite").exists()
    assert not ray_processes(port)
