"""Shared by the bench drivers: thread settings, child processes, RESULT lines."""

import os
import statistics
import subprocess
import sys


def line_buffered():
    """Progress lines show up at once even when stdout is a pipe."""
    sys.stdout.reconfigure(line_buffering=True)


def default_threads():
    return os.cpu_count() or 1


def child_env(threads, extra=None):
    """Same thread counts for both sides: Strata's pool, OpenBLAS (both link
    the same libopenblas) and OpenMP (torch's intra-op pool)."""
    env = dict(os.environ)
    env.update(extra or {})
    env["STRATA_NUM_THREADS"] = str(threads)
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def parse_result(stdout):
    """The key=value pairs of the last 'RESULT ...' line."""
    lines = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
    if not lines:
        raise RuntimeError("no RESULT line in:\n" + stdout)
    out = {}
    for field in lines[-1].split()[1:]:
        k, _, v = field.partition("=")
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = v
    return out


def run_child(argv, threads, extra_env=None):
    p = subprocess.run(argv, env=child_env(threads, extra_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit("bench: %s exited with %d" % (argv[0], p.returncode))
    return parse_result(p.stdout)


def median(values):
    return statistics.median(values)


def load_average():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


# PyTorch's OpenMP threads spin after each parallel region by default; on a
# loaded machine that spinning competes with OpenBLAS's threads and can cost
# torch 10x. The drivers run torch both ways and keep its faster figure, so the
# baseline is the best of its usual settings, never a crippled one. Strata runs
# as many times per round (STRATA_RUNS_PER_ROUND) and keeps its faster figure
# too, so neither side gets more draws from a noisy machine.
TORCH_CONFIGS = [("omp-default", {}), ("omp-passive", {"OMP_WAIT_POLICY": "PASSIVE"})]


def run_round(strata_once, torch_argv, threads, key):
    """One round: Strata's side (strata_once() -> result dict) and torch's side
    under each TORCH_CONFIGS entry, alternating, so both get the same number of
    draws spread over the same stretch of time. Returns (best Strata result,
    best torch result, the torch config it came from); best = smallest `key`."""
    strata, torch = [], []
    for name, extra in TORCH_CONFIGS:
        strata.append(strata_once())
        torch.append((run_child(torch_argv, threads, extra), name))
    best_torch = min(torch, key=lambda rc: rc[0][key])
    return min(strata, key=lambda r: r[key]), best_torch[0], best_torch[1]


def torch_train_step(model, batch, device="cpu", fused_adam=False, compile_model=False):
    """PyTorch's side of one training step of a bench model: forward, cross
    entropy, accuracy, backward, Adam and a cosine schedule stepped every
    step (as the Strata programs do), with the loss and accuracy read back.
    Returns step(), which returns (loss, accuracy)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    dev = torch.device(device)
    torch.manual_seed(0)
    if model == "mlp":
        net = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                            nn.Linear(128, 100), nn.ReLU(), nn.Linear(100, 10))
        x = torch.rand(batch, 784, device=dev)
    elif model == "convnet":
        net = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                            nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
        x = torch.rand(batch, 1, 28, 28, device=dev)
    else:
        raise SystemExit("error: unknown model " + model)
    net = net.to(dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, **({"fused": True} if fused_adam else {}))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1_000_000)
    if compile_model:
        net = torch.compile(net)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = net(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(1) == y).float().mean()
        loss.backward()
        opt.step()
        sched.step()
        return loss.item(), acc.item()

    return step


def time_steps(step, warmup, steps):
    """Runs max(warmup, 5) steps, which must lower the loss on the fixed
    batch, then times `steps` more; returns (first_loss, last_loss, ms list)."""
    import time

    first = last = None
    for _ in range(max(warmup, 5)):
        last, _ = step()
        first = last if first is None else first
    if not last < first:
        raise SystemExit("error: torch validation: loss did not fall on a fixed batch (%g -> %g)" % (first, last))
    ms = []
    for _ in range(steps):
        t0 = time.perf_counter()
        last, _ = step()
        ms.append((time.perf_counter() - t0) * 1e3)
    return first, last, ms
