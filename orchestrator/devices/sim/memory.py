"""Device memory on the simulated GPU: what a trial's framework holds, as NVML would see it.

The sim's kernels run on the host, so nothing is allocated on a simulated board. A trial tells
the sim what its workload would hold on a real one (``simDeviceSetAllocatedBytes``), and
``nvmlDeviceGetMemoryInfo`` then reports it as used, on top of the driver's reserve. What the
worker asks for is modelled here from the workload's in-use footprint at ``workload.sim_size``
(``kernels.Workload.footprint``: parameters, optimizer state, gradients and the activations a
training step keeps; for a kernel without one, its inputs and output) and the process's policy,
which ``orchestrator.measuring.worker.WORKER_ENV`` sets for JAX and TensorFlow:

- a CUDA context per process, :data:`CONTEXT_BYTES` (about 0.5 GiB on recent drivers, and
  lazily loaded modules keep it near that);
- JAX with ``XLA_PYTHON_CLIENT_PREALLOCATE=false``: XLA's BFC allocator takes device memory as
  it needs it and keeps it, so its pool is the in-use peak rounded up to the 2 MiB the CUDA
  driver maps at once;
- TensorFlow with memory growth (``TF_FORCE_GPU_ALLOW_GROWTH``): its BFC allocator grows by
  regions that double each time (``curr_region_allocation_bytes_ *= 2`` in TensorFlow's
  ``bfc_allocator.cc``), from :data:`TF_FIRST_REGION_BYTES`; the pool is the sum of the regions
  that the in-use peak needed, so up to about twice the peak;
- PyTorch's CUDA caching allocator: a large block (over 1 MiB) is rounded up to 2 MiB
  (``kRoundLarge`` in ``CUDACachingAllocator.cpp``) and kept cached when freed, so its reserved
  pool is, like JAX's, the in-use peak in 2 MiB granules (the 20 MiB segments it takes for
  blocks of 1-10 MiB, and fragmentation, are not modelled).

Every framework's *in-use* peak (what ``memory_stats()``, ``get_memory_info()`` and
``torch.cuda.max_memory_allocated`` report) is the same footprint here: the sim does not know how
each compiles a step (XLA fuses and reuses buffers, a TensorFlow graph or PyTorch's eager autograd
keeps more intermediates). Only the pool, NVML's used memory, differs by framework. The sim cannot
tell which framework needs less memory for a model; a GPU can.
"""

from __future__ import annotations

from typing import Any

from orchestrator.devices.sim.driver import gpu_of
from orchestrator.devices.sim.processes import CONTEXT_BYTES, held_bytes, hold

DRIVER_GRANULE_BYTES = 2 * 2**20
TF_FIRST_REGION_BYTES = 2 * 2**20


def allocator_pool_bytes(in_use_bytes: int, framework: str) -> int:
    """The device memory a framework's allocator holds for an in-use peak, context excluded.

    Args:
        in_use_bytes: the peak bytes in use (the workload's footprint).
        framework: ``"jax"``, ``"tensorflow"`` or ``"pytorch"`` (JAX's and PyTorch's pools
            are both the peak in 2 MiB granules).
    """
    need = max(int(in_use_bytes), 0)
    if framework == "tensorflow":
        pool, region = 0, TF_FIRST_REGION_BYTES
        while pool < need:
            pool, region = pool + region, region * 2
        return pool
    return -(-need // DRIVER_GRANULE_BYTES) * DRIVER_GRANULE_BYTES


def process_bytes(in_use_bytes: int, framework: str) -> int:
    """What NVML counts used for one worker process: its context and its allocator's pool."""
    return CONTEXT_BYTES + allocator_pool_bytes(in_use_bytes, framework)


def simDeviceSetAllocatedBytes(handle: Any, nbytes: int) -> None:
    """Sim extension: the bytes the calling process now holds on the GPU; NVML lists it among
    the GPU's running processes with that memory (0: it holds nothing and is not listed).
    See ``processes.py``."""
    m, i = gpu_of(handle)
    m.update(i, lambda s: hold(s, max(int(nbytes), 0)))


def allocated_bytes(state: dict[str, Any]) -> int:
    """What the live processes hold on the GPU, from its state (0 when none does). A record of
    a process that has exited counts for nothing, as its memory went with it."""
    return held_bytes(state)
