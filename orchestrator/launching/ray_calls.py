"""Small calls on Ray the pool and the supervisor share: join a cluster, end a worker, say why
a call failed, keep our SIGTERM handler across ``ray.init``. Ray is imported only inside them."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any


def join_ray(address: str, **init_kwargs: Any) -> None:
    """Connect this process to a running Ray cluster (``auto``, ``host:port`` or ``ray://...``).

    A cluster started by ``ray start`` uses token authentication (Ray 2.60); ``ray.init`` turns
    it on for ``address="auto"`` when it finds the token (``~/.ray/auth_token``,
    ``RAY_AUTH_TOKEN_PATH`` or ``RAY_AUTH_TOKEN``) but not for an explicit address, which then
    fails with ``InvalidAuthToken``: turn it on the same way for every address. Ray has no
    public call for this; its own ``ray.init(address="auto")`` path calls the same function.
    """
    import importlib

    import ray

    try:
        setup = importlib.import_module("ray._private.authentication.authentication_token_setup")
    except ImportError:  # another Ray version: nothing to do
        pass
    else:
        if not address.startswith("ray://"):
            setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    ray.init(address=address, **init_kwargs)


@contextlib.contextmanager
def keeping_sigterm_handler() -> Iterator[None]:
    """Keep this process's SIGTERM handler across ``ray.init``.

    ``ray.init`` replaces it (Python's with ``sys.exit``, then its core worker's C++ handler, which
    prints a stack and aborts): ``dvfs sweep`` handles SIGTERM itself, closing the workers (each
    restores its GPU) and keeping every stored row.
    """
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and handler is not None:
            signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def hidden_from_ray(variable: str | None) -> Iterator[None]:
    """Start Ray without ``variable`` in the environment its processes inherit.

    A local instance for the simulated GPUs or the host CPU declares its own logical GPUs; a
    ``CUDA_VISIBLE_DEVICES`` in the user's shell (``""`` on a machine told to hide its GPUs) says
    nothing about them, and Ray refuses to start 4 GPUs when it lists fewer. Ray sets each worker's
    own after, for the logical GPU it gives it.
    """
    saved = os.environ.pop(variable, None) if variable else None
    try:
        yield
    finally:
        if saved is not None:
            os.environ[variable] = saved


def kill(actor: Any) -> None:
    """End a worker now (SIGKILL: what it was doing is lost; its lease is freed by the OS)."""
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone, or Ray is down
        pass


def first_line(e: BaseException) -> str:
    """The first line of what went wrong in a worker (the cause of a RayTaskError)."""
    cause = getattr(e, "cause", None)
    text = f"{type(cause).__name__}: {cause}" if isinstance(cause, BaseException) else str(e)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0][:500] if lines else type(e).__name__
