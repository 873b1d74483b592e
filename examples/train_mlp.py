"""A user's own program: a small MLP trained with SGD, in JAX or in PyTorch, measured with ``dvfs``.

This is the worked example of the window API (``import dvfs``) and of ``workload=command``. It
runs on its own::

    python examples/train_mlp.py --framework jax            # prints its window and its loss
    DVFS_DEVICE=sim python examples/train_mlp.py            # on the simulated GPU

and as a trial at each point of a sweep, judged by its final loss against the loss at the
device's default setting::

    dvfs sweep -m hydra/launcher=basic workload=command \\
        'workload.argv=[python,examples/train_mlp.py,--framework,${framework.name}]' \\
        framework=jax,pytorch device.sm_clock_mhz=810,1110,1410 workload.sim_scale=2048

What it does, in either framework, from the same bits:

- **Data made here**: ``--samples`` points in ``--features`` dimensions drawn from a seeded NumPy
  generator, labelled by a fixed random "teacher" network into ``--classes`` classes; put on the
  device once, before the window (no host copy inside it).
- **The model**: ``features -> hidden -> hidden -> classes``, ReLU, softmax cross-entropy; its
  initial weights drawn in NumPy, so JAX and PyTorch start from the same parameters; SGD with
  momentum 0.9.
- **The step** is wrapped with ``dvfs.charged`` (``items=`` the batch): on the simulated GPU each
  call is charged the work its framework compiled (times ``DVFS_SIM_SCALE``) and the sim's faults
  reach it (the PyTorch step updates its model in place, so the model is its ``state``). The
  first step (the JAX compile) runs before the window.
- **The window** ``train`` covers the other ``--steps - 1`` steps; its unit is ``samples``.
- **The result**: the loss and accuracy over the whole data set after training, reported with
  ``dvfs.report_result``.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

import dvfs


def make_data(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """The data set (inputs, integer labels) and the model's initial weights, in float32."""
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((args.samples, args.features)).astype(np.float32)
    teacher = rng.standard_normal((args.features, args.classes)).astype(np.float32)
    y = np.argmax(np.tanh(x @ teacher) + 0.1 * rng.standard_normal((args.samples, args.classes)),
                  axis=1).astype(np.int32)
    dims = [args.features, args.hidden, args.hidden, args.classes]
    weights = []
    for fan_in, fan_out in zip(dims, dims[1:]):
        weights.append((rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in))
                       .astype(np.float32))
        weights.append(np.zeros(fan_out, np.float32))
    return x, y, weights


def train_jax(args: argparse.Namespace) -> tuple[dvfs.Window, dict[str, float]]:
    """Train in JAX (a jitted functional step); returns the window and the final metrics."""
    import jax
    import jax.numpy as jnp

    x_np, y_np, init = make_data(args)
    x, y = jnp.asarray(x_np), jnp.asarray(y_np)
    params = [jnp.asarray(w) for w in init]
    velocity = [jnp.zeros_like(w) for w in params]

    def loss_fn(params: list[Any], xb: Any, yb: Any) -> Any:
        h = xb
        for i in range(0, len(params) - 2, 2):
            h = jax.nn.relu(h @ params[i] + params[i + 1])
        logits = h @ params[-2] + params[-1]
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(yb.shape[0]), yb])

    @jax.jit
    def train_step(params: list[Any], velocity: list[Any], i: Any) -> tuple[Any, Any, Any]:
        start = (i * args.batch) % (args.samples - args.batch + 1)
        xb = jax.lax.dynamic_slice_in_dim(x, start, args.batch)
        yb = jax.lax.dynamic_slice_in_dim(y, start, args.batch)
        loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
        velocity = [0.9 * v + g for v, g in zip(velocity, grads)]
        params = [p - args.lr * v for p, v in zip(params, velocity)]
        return params, velocity, loss

    step = dvfs.charged(train_step, items=args.batch)
    params, velocity, _ = step(params, velocity, 0)  # compiles: outside the window
    with dvfs.window("train", unit="samples") as w:
        for i in range(1, args.steps):
            params, velocity, _ = step(params, velocity, i)
    logits_loss = float(loss_fn(params, x, y))
    h = x
    for i in range(0, len(params) - 2, 2):
        h = jax.nn.relu(h @ params[i] + params[i + 1])
    accuracy = float(jnp.mean(jnp.argmax(h @ params[-2] + params[-1], axis=1) == y))
    return w.result, {"loss": logits_loss, "accuracy": accuracy}


def train_pytorch(args: argparse.Namespace) -> tuple[dvfs.Window, dict[str, float]]:
    """Train in PyTorch (eager, the optimizer updating the model in place)."""
    import torch

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x_np, y_np, init = make_data(args)
    x = torch.from_numpy(x_np).to(device)
    y = torch.from_numpy(y_np).long().to(device)
    layers: list[torch.nn.Module] = []
    for i in range(0, len(init), 2):
        linear = torch.nn.Linear(*init[i].shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(init[i].T.copy()))
            linear.bias.copy_(torch.from_numpy(init[i + 1]))
        layers += [linear, torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    def train_step(i: int) -> Any:
        start = (i * args.batch) % (args.samples - args.batch + 1)
        xb, yb = x[start:start + args.batch], y[start:start + args.batch]
        optimizer.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        return loss.detach()

    step = dvfs.charged(train_step, items=args.batch, state=model, framework="pytorch")
    step(0)  # the first step makes the optimizer's state: outside the window, as in JAX
    with dvfs.window("train", unit="samples") as w:
        for i in range(1, args.steps):
            step(i)
    with torch.no_grad():
        logits = model(x)
        loss = float(torch.nn.functional.cross_entropy(logits, y))
        accuracy = float((logits.argmax(dim=1) == y).float().mean())
    return w.result, {"loss": loss, "accuracy": accuracy}


def main(argv: list[str] | None = None) -> int:
    """Train, print the window, report the loss; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("jax", "pytorch"), default="jax")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    train = train_jax if args.framework == "jax" else train_pytorch
    window, metrics = train(args)
    dvfs.report_result(metrics)
    energy = "no energy reading" if window.energy_j is None else (
        f"{window.energy_j:.3g} J, {window.energy_per_item_j * 1e6:.3g} uJ/sample")
    print(f"{args.framework}: {args.steps - 1} steps, {window.items:.0f} samples in "
          f"{window.time_s:.3g} s ({window.rate:.4g} samples/s), {energy}; "
          f"loss {metrics['loss']:.4f}, accuracy {metrics['accuracy']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
