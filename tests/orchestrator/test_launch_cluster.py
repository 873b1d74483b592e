"""The ray_gpus launcher joining a two-node Ray cluster started on this machine.

Each node is a ``ray start`` of its own (``--block``, in its own process group, so the test ends
exactly the processes it started) with 2 logical GPUs and its own simulated machine: the node's
``DVFS_SIM_STATE_DIR`` is inherited by every worker Ray starts there, and the two machines have
different seeds, so their GPUs have different UUIDs, as two real nodes' GPUs do. The sweep joins
by address; its rows must come from both nodes and all reach the driver's store.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_sim(state: Path, seed: int) -> list[str]:
    from orchestrator.devices import open_backend

    with open_backend(
        {"backend": "sim", "count": 2, "seed": seed, "state_dir": str(state)}
    ) as backend:
        return [d.identity.uuid for d in backend.devices()]


def start_node(args: list[str], state: Path, log: Path) -> subprocess.Popen:
    # RAY_AUTH_MODE=token: `ray start --address=...` (Ray 2.60) does not turn token auth on
    # by itself.
    env = dict(os.environ, DVFS_SIM_STATE_DIR=str(state), RAY_AUTH_MODE="token")
    return subprocess.Popen(
        [RAY, "start", "--block", "--num-gpus=2", "--num-cpus=1", *args],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_node(proc: subprocess.Popen) -> None:
    """End the node's process group (the `ray start` we spawned and the daemons it started)."""
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two Ray nodes on 127.0.0.1, two simulated GPUs each; yields (address, {node: uuids})."""
    import ray

    from orchestrator.launching.ray_calls import join_ray

    root = tmp_path_factory.mktemp("cluster")
    head_sim, node_sim = root / "head-sim", root / "node-sim"
    uuids = {"head": make_sim(head_sim, seed=0), "node": make_sim(node_sim, seed=1)}
    port = free_port()
    address = f"127.0.0.1:{port}"
    head = ["--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--include-dashboard=false"]
    procs = [start_node(head, head_sim, root / "head.log")]
    try:
        time.sleep(3)
        procs.append(
            start_node(
                [f"--address={address}", "--node-ip-address=127.0.0.1"], node_sim, root / "node.log"
            )
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                if not ray.is_initialized():
                    join_ray(address, log_to_driver=False)  # what the launcher does
                if ray.cluster_resources().get("GPU", 0) >= 4:
                    break
            except Exception:  # noqa: BLE001 - the head is still starting
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "the two-node cluster did not come up: "
                    + (root / "head.log").read_text()[-2000:]
                )
            time.sleep(1)
        yield address, uuids
    finally:
        from orchestrator.launching.pool import close_pool

        close_pool()
        if ray.is_initialized():
            ray.shutdown()
        for proc in reversed(procs):
            stop_node(proc)


def test_a_sweep_joining_a_two_node_cluster_runs_on_both_nodes_and_stores_every_row(
    cluster, tmp_path, capsys
):
    from orchestrator.app import run_sweep
    from orchestrator.results.store import ResultStore

    address, uuids = cluster
    d = tmp_path / "sweep"
    rc = run_sweep(
        [
            "-m",
            f"hydra.launcher.address={address}",
            "device.count=2",
            "workload.size=tiny",
            "measure=quick",
            "quiet=true",
            "device.sm_clock_mhz=1065,1140,1215,1290,1365,1410",
            "workload=gemm,stencil",
            f"hydra.sweep.dir={d}",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    with ResultStore(d, readonly=True) as store:
        rows = store.rows()
    assert len(rows) == 12 and all(r["status"] == "ok" for r in rows)
    used = {r["device_uuid"] for r in rows}
    assert used & set(uuids["head"]) and used & set(uuids["node"])  # both nodes ran trials
    assert used <= set(uuids["head"]) | set(uuids["node"])
    nodes = {r["launch"]["node_id"] for r in rows}
    assert len(nodes) == 2
    for r in rows:  # a GPU's rows all come from one node
        side = "head" if r["device_uuid"] in uuids["head"] else "node"
        assert {x["launch"]["node_id"] for x in rows if x["device_uuid"] in uuids[side]} == {
            r["launch"]["node_id"]
        }
    err = capsys.readouterr().err
    assert "on 4 GPU(s)" in err and f"dvfs report {d}" in err
