"""The ray_gpus Hydra launcher as a user meets it: discovered by Hydra, the default for multiruns,
run through ``dvfs sweep -m`` in a fresh process that starts its own local Ray instance.

(Hydra's plugin scanner may import this module as ``hydra_plugins.test_...`` too, since ``tests/``
is on the path: it does nothing at import time.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from support import DVFS, REPO

QUICK = ["workload.size=tiny", "measure=quick", "quiet=true"]


def run(*args: str, timeout_s: float = 240, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*DVFS, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
        env=None if env is None else {**os.environ, **env},
    )


def test_ray_gpus_is_discovered_and_is_the_default_multirun_launcher():
    from hydra import compose, initialize_config_dir

    from orchestrator.config import CONF_DIR, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            config_name="config",
            return_hydra_config=True,
            overrides=["hydra.launcher.placement=[GPU-aaaa-1,GPU-bbbb-2]"],
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.dvfs.ray_gpus_launcher.RayGpusLauncher"
    assert list(launcher.placement) == ["GPU-aaaa-1", "GPU-bbbb-2"]
    assert launcher.address is None and launcher.timeout_s is None and launcher.num_cpus == 0
    assert launcher.max_restarts == 5 and launcher.lease_wait_s is None and launcher.progress
    assert launcher.dashboard is False  # off unless asked


def test_importing_the_plugin_imports_no_ray():
    code = (
        "import sys, hydra_plugins.dvfs.ray_gpus_launcher, orchestrator.cli; "
        "print(json.dumps([m for m in ('ray', 'jax', 'tensorflow') if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


@pytest.mark.slow
def test_dvfs_sweep_m_starts_a_local_ray_and_stores_a_row_for_every_job(sim_dir, tmp_path):
    from orchestrator.results.store import ResultStore

    d = tmp_path / "sweep"
    proc = run(
        "sweep",
        "-m",
        "device.count=2",
        *QUICK,
        "workload=gemm,stencil",
        "device.sm_clock_mhz=1065,1410",
        f"hydra.sweep.dir={d}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with ResultStore(d, readonly=True) as store:
        rows = store.rows()
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    assert len({r["device_uuid"] for r in rows}) <= 2 and all(
        r["launch"]["launcher"] == "ray_gpus" for r in rows
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ray_gpus: 4 trial(s) on 2 GPU(s)") and last.endswith(
        f"report: dvfs report {d}"
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_ctrl_c_as_the_workers_close_after_the_summary_waits_for_every_gpu_and_exits_130(
    sim_dir, tmp_path
):
    """After its summary line the sweep closes its workers (each puts its GPU back) and stops its
    Ray, inside the command. A Ctrl-C then (here: as the close begins) waits for the close and
    stops the command as any other: its line, 130, no traceback, no GPU left set. (Left to the
    exit handlers, the close was broken off with "Exception ignored in atexit callback", Ray's
    shutdown ended the workers unwaited for, and the command exited 0.)"""
    from orchestrator.devices.sim.state import Machine
    from orchestrator.testing.chaos import SUMMARY

    code = (
        "import signal, sys\n"
        "from orchestrator.launching.pool import GpuPool\n"
        "close = GpuPool.close\n"
        "def ctrl_c_then_close(pool):\n"
        "    signal.raise_signal(signal.SIGINT)\n"
        "    close(pool)\n"
        "GpuPool.close = ctrl_c_then_close\n"
        "from orchestrator.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "sweep", "-m", "device.count=2", *QUICK,
         "device.sm_clock_mhz=1065,1410", f"hydra.sweep.dir={tmp_path / 's'}"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert SUMMARY in lines[-2]  # the chaos run tells a sweep that had ended by this line
    assert lines[-1].startswith("dvfs sweep: interrupted (Ctrl-C)")
    assert "Traceback" not in proc.stderr
    assert [Machine(sim_dir).read(i)["locked_sm_mhz"] for i in range(2)] == [None, None]
    assert not list((sim_dir / "journal").glob("*.json"))


@pytest.mark.slow
def test_the_workers_of_the_ray_dvfs_sweep_starts_run_at_its_priority_not_nice_15(
    sim_dir, tmp_path
):
    """Ray nices its workers to 15. A worker is the sweep's work (a trial's host-side dispatch is
    inside its window): beside two busy loops on a 2-core machine a nice-15 worker got 6 % of a
    core, and a 25-minute test sweep timed out. Its niceness is read while its trial runs."""
    import threading

    journal = sim_dir / "journal"
    seen: list[int] = []
    done = threading.Event()

    def watch():
        while not done.is_set() and not seen:
            for trace in journal.glob("*.trace"):
                try:
                    pid = json.loads(trace.read_text())["pid"]
                    seen.append(os.getpriority(os.PRIO_PROCESS, pid))
                except (OSError, ValueError, KeyError):  # being written, or ended meanwhile
                    pass
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    proc = run("sweep", "-m", *QUICK, "device.sm_clock_mhz=1065,1410",
               "device.inject={slow_s:0.02,times:null}", f"hydra.sweep.dir={tmp_path / 's'}")
    done.set()
    watcher.join()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert seen and set(seen) == {os.getpriority(os.PRIO_PROCESS, 0)}


def test_a_refused_job_exits_2_with_one_line_before_ray_starts(sim_dir, tmp_path):
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    proc = run("sweep", "-m", *QUICK, "measure.repeats=1,0", f"hydra.sweep.dir={tmp_path / 's'}",
               env={"RAY_TMPDIR": str(ray_tmp)})
    assert proc.returncode == 2
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("dvfs sweep: error:")]
    assert (
        len(errors) == 1
        and "job #1 (measure.repeats=0): measure.repeats=0 must be between 1 and 1000" in errors[0]
    )
    assert "starting" not in proc.stderr
    assert list(ray_tmp.iterdir()) == []  # no Ray session was ever started


def test_a_bad_launcher_setting_exits_2(sim_dir, tmp_path):
    proc = run(
        "sweep",
        "-m",
        *QUICK,
        "hydra.launcher.placement=somewhere",
        f"hydra.sweep.dir={tmp_path / 's'}",
    )
    assert proc.returncode == 2
    assert (
        "hydra.launcher.placement='somewhere' is not one of: any, every, [GPU UUIDs]" in proc.stderr
    )


def _listening_ports(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket these processes listen on (from /proc)."""
    import ipaddress
    import os
    from pathlib import Path

    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            pass
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, _, state, *_, inode = line.split()[1:10]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hex_ip, hex_port = local.split(":")
            raw = bytes.fromhex(hex_ip)
            # /proc prints each 32-bit word of the address in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(raw)
            ip = getattr(ip, "ipv4_mapped", None) or ip  # ::ffff:127.0.0.1 is 127.0.0.1
            found.add((str(ip), int(hex_port, 16)))
    return found


def _descendants(pid: int) -> set[int]:
    from orchestrator.testing.chaos_watch import descendants  # as the chaos run finds them

    return {pid, *descendants(pid)}


@pytest.mark.slow
def test_the_local_ray_a_sweep_starts_listens_on_loopback_only_with_no_dashboard(sim_dir, tmp_path):
    """Every socket the sweep's own Ray listens on (GCS, raylet, workers, agents) is bound to
    loopback; there is no web dashboard; and its GCS refuses a call without Ray's token."""
    import os
    import signal
    import socket

    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    from orchestrator.results.store import ResultStore

    d = tmp_path / "sweep"
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(sim_dir))
    for var in ("RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(var, None)
    proc = subprocess.Popen(
        [*DVFS, "sweep", "-m", "device.count=2", *QUICK, "measure.window_s=3",
         "device.sm_clock_mhz=range(960,1411,15)", f"hydra.sweep.dir={d}"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if (d / "trials.sqlite").exists():
                with ResultStore(d, readonly=True) as store:
                    if len(store):
                        break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        tree = _descendants(proc.pid)
        ports = _listening_ports(tree)
        gcs = {port for _, port in _listening_ports({p for p in tree if "gcs_server" in _cmd(p)})}
        assert ports and len(gcs) == 1
        assert all(addr in ("127.0.0.1", "::1") for addr, _ in ports), ports
        with pytest.raises(OSError):  # no web dashboard
            socket.create_connection(("127.0.0.1", 8265), timeout=2).close()
        channel = grpc.insecure_channel(f"127.0.0.1:{gcs.pop()}")
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        channel.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    assert proc.returncode == 143


def _cmd(pid: int) -> str:
    from orchestrator.testing.chaos_watch import cmdline

    return cmdline(pid)
