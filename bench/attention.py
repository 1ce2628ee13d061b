"""bench/attention: Strata's tensor-core flash attention against PyTorch's
F.scaled_dot_product_attention on the same GPU in one run, forward and
gradient apart, at a GPT-2 124M layer's shape by default (batch 8, 12 heads
of 64, 1024 tokens, causal, bf16).

Strata: //bench:attention_bench (kernels/cuda/flash_attention.h, both head
layouts; WMMA, STRATA_MMA_ATTENTION=0, and mma.sync, the default since
2026-11-29, timed last, with 32-row warps and, as "mma16", with 16-row ones,
and, as "stored", with the gradient on stored score gradients,
STRATA_STORED_SCORE_GRADS=1). PyTorch: SDPA
on [B, H, T, D] bf16 tensors with its default backend choice and with each backend it has here (flash, cuDNN, memory
efficient); the forward timed alone, the gradient as (forward + backward) -
forward, each over back-to-back calls between CUDA events. FLOPs as
FlashAttention's papers count them (forward 4 B H T^2 D, halved when causal;
gradient 2.5x).

Printed: ms and TFLOP/s a call on each side, and torch's time / Strata's for
each torch backend (> 1: Strata faster).

On the GPU machine, from the repository root (attention_bench bundled with
../shared/tools/device-bundle; tools/gpu_check.sh bundle does):
  python3 bench/attention.py --strata "bash .device/run.sh attention_bench"
"""

import argparse
import re
import shlex
import statistics
import subprocess


def strata_side(a):
    argv = shlex.split(a.strata) + ["--batch=%d" % a.batch, "--heads=%d" % a.heads, "--seq=%d" % a.seq,
                                    "--head_dim=%d" % a.head_dim, "--causal=%s" % str(a.causal).lower(),
                                    "--iters=%d" % a.iters, "--repeats=%d" % a.repeats]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        # Keep what it timed before failing (the kernels not yet run on a GPU come last) and go on to torch.
        print("bench: %s exited with %d (the rows it printed are kept):\n%s" % (
            " ".join(argv), p.returncode, "\n".join(p.stdout.splitlines()[-5:])))
    results = {}
    for m in re.finditer(r"RESULT kernel=(\S+) layout=(\S+) ms=([0-9.]+)", p.stdout):
        results[(m.group(1), m.group(2))] = float(m.group(3))
    return results


def torch_side(a):
    import torch
    import torch.nn.functional as F
    B, H, T, D = a.batch, a.heads, a.seq, a.head_dim
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dy = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)

    def timed(f):
        times = []
        for _ in range(a.repeats):
            for _ in range(5):
                f()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(a.iters):
                f()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / a.iters)
        return statistics.median(times)

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)

    def forward_backward():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
        torch.autograd.grad(y, (q, k, v), dy)

    backends = [("default", None)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backends += [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    except ImportError:
        sdpa_kernel = None
    results = {}
    for name, backend in backends:
        try:
            if backend is None:
                fwd, both = timed(forward), timed(forward_backward)
            else:
                with sdpa_kernel([backend]):
                    fwd, both = timed(forward), timed(forward_backward)
        except RuntimeError as e:  # a backend this build or GPU lacks
            print("torch %s: not available (%s)" % (name, str(e).splitlines()[0][:100]))
            continue
        results[name] = (fwd, both - fwd)
    return torch.__version__, torch.cuda.get_device_name(0), results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True, help="command that runs attention_bench")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--head_dim", type=int, default=64)
    ap.add_argument("--causal", type=lambda s: s.lower() != "false", default=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    strata = strata_side(a)
    version, name, torch_results = torch_side(a)
    flops = 4.0 * a.batch * a.heads * a.seq * a.seq * a.head_dim * (0.5 if a.causal else 1.0)
    tflops = lambda ms, f: f / (ms * 1e-3) / 1e12
    print("attention: %s, torch %s; batch %d, %d heads of %d, %d tokens, %s, bf16" % (
        name, version, a.batch, a.heads, a.head_dim, a.seq, "causal" if a.causal else "not causal"))
    print("%-22s | %9s %8s | %9s %8s" % ("side", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s"))
    for layout in ("bhtd", "bthd"):
        f, b = strata.get(("flash_fwd", layout)), strata.get(("flash_bwd", layout))
        if f is None or b is None:
            continue
        print("%-22s | %9.4f %8.1f | %9.4f %8.1f" % ("strata " + layout, f, tflops(f, flops), b,
                                                     tflops(b, 2.5 * flops)))
        for kernel, label in (("mma", "strata mma.sync "), ("mma16", "strata mma16 "), ("stored", "strata stored dS ")):
            mf, mb = strata.get((kernel + "_fwd", layout)), strata.get((kernel + "_bwd", layout))
            if mf is not None:
                print("%-22s | %9.4f %8.1f | %9s %8s" % (
                    label + layout, mf, tflops(mf, flops), "%.4f" % mb if mb else "-",
                    "%.1f" % tflops(mb, 2.5 * flops) if mb else "-"))
    for backend, (f, b) in torch_results.items():
        print("%-22s | %9.4f %8.1f | %9.4f %8.1f" % ("torch " + backend, f, tflops(f, flops), b,
                                                     tflops(b, 2.5 * flops)))
    sf, sb = strata.get(("flash_fwd", "bthd")), strata.get(("flash_bwd", "bthd"))
    if sf is None or sb is None:
        raise SystemExit("bench: no Strata figures for the bthd layout")
    mf, mb = strata.get(("mma_fwd", "bthd")), strata.get(("mma_bwd", "bthd"))
    if mf is not None:
        print("strata mma.sync / WMMA (bthd): forward %.2fx faster%s" % (
            sf / mf, ", gradient %.2fx faster" % (sb / mb) if mb else ""))
    for backend, (f, b) in torch_results.items():
        if mf is not None and mb is not None:
            print("RESULT attention_mma side=%s strata_fwd_ms=%.4f strata_bwd_ms=%.4f fwd_ratio=%.3f bwd_ratio=%.3f" % (
                backend, mf, mb, f / mf, b / mb))
    for backend, (f, b) in torch_results.items():
        print("torch-%s / strata bthd: forward %.2fx, gradient %.2fx" % (backend, f / sf, b / sb))
        print("RESULT attention side=%s strata_fwd_ms=%.4f strata_bwd_ms=%.4f torch_fwd_ms=%.4f torch_bwd_ms=%.4f "
              "fwd_ratio=%.3f bwd_ratio=%.3f" % (backend, sf, sb, f, b, f / sf, b / sb))


if __name__ == "__main__":
    main()
