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
