#!/usr/bin/env python3
"""bench/gemm_torch.py: PyTorch's torch.matmul on the GEMMs of a GPT-2 124M
training step (8 x 1024 tokens), timed as bench/gemm_bench times Strata's
LtGemm, printing the same columns so the rows line up with its table.

  python3 bench/gemm_torch.py [--dtype=f32|bf16|both] [--repeats=3]

f32 runs with torch.backends.cuda.matmul.allow_tf32 = False (full FP32);
bf16 with PyTorch's defaults (FP32 accumulate). Each timing: --warmup calls,
then N >= --min_iters back-to-back torch.matmul(a, b, out=c) calls, enough
for --min_ms, between two CUDA events; the whole measurement repeats
--repeats times. TFLOP/s = 2 M N K / time per GEMM. A transposed operand is a
.t() view, so torch hands cuBLAS a transpose flag and copies nothing.

Standalone: the standard library and torch only. Exits 1 with one
'error: ...' line on stderr when there is no CUDA device or a check fails.
"""

import argparse
import datetime
import statistics
import sys

import torch

DEVICE = "cuda"
ROWS = 8 * 1024  # batch 8 x 1024 tokens
MODEL, VOCAB, LAYERS = 768, 50257, 12


def gpt2_training_shapes():
    """(name, M, N, K, transpose_a, transpose_b, runs per step), as gemm_bench.cc.

    HF GPT-2: each block's linears store W as [in, out] (y = x @ W); the LM
    head is the tied token embedding wte [vocab, d_model] (logits = x @ wte^T).
    Backward of y = x @ W: dx = dy @ W^T, dW = x^T @ dy."""
    shapes = []
    for name, n_in, n_out in [("qkv", MODEL, 3 * MODEL), ("attn.proj", MODEL, MODEL),
                              ("mlp.fc", MODEL, 4 * MODEL), ("mlp.proj", 4 * MODEL, MODEL)]:
        shapes.append((name + ".fwd", ROWS, n_out, n_in, False, False, LAYERS))
        shapes.append((name + ".dx", ROWS, n_in, n_out, False, True, LAYERS))
        shapes.append((name + ".dw", n_in, n_out, ROWS, True, False, LAYERS))
    shapes.append(("lm_head.fwd", ROWS, VOCAB, MODEL, False, True, 1))
    shapes.append(("lm_head.dx", ROWS, MODEL, VOCAB, False, False, 1))
    shapes.append(("lm_head.dw", VOCAB, MODEL, ROWS, True, False, 1))
    return shapes


DTYPES = {
    "f32": (torch.float32, "FP32 in and out, full FP32 (allow_tf32 = False)", 1e-3),
    "bf16": (torch.bfloat16, "bf16 in and out, FP32 accumulate (PyTorch's defaults)", 2e-2),
}


def fail(message):
    sys.stdout.flush()
    sys.stderr.write("error: %s\n" % message)
    sys.exit(1)


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def time_per_call_ms(call, iterations):
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        call()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iterations


def operands(buffers, shape):
    """Views of the shared buffers as the shape's stored a, b, c, and op(a), op(b)."""
    _, m, n, k, ta, tb, _ = shape
    a = buffers["a"][: m * k].view((k, m) if ta else (m, k))
    b = buffers["b"][: k * n].view((n, k) if tb else (k, n))
    c = buffers["c"][: m * n].view(m, n)
    return (a.t() if ta else a), (b.t() if tb else b), c


def validate(name, dtype_name, tolerance, op_a, op_b, c):
    """c against a float64 reference at the corners and 124 random entries,
    within tolerance x the largest |c| among them (as gemm_bench)."""
    m, n = c.shape
    gen = torch.Generator().manual_seed(m * 31 + n * 17 + op_a.shape[1])
    rows = torch.cat([torch.tensor([0, 0, m - 1, m - 1]), torch.randint(0, m, (124,), generator=gen)])
    cols = torch.cat([torch.tensor([0, n - 1, 0, n - 1]), torch.randint(0, n, (124,), generator=gen)])
    rows, cols = rows.to(c.device), cols.to(c.device)
    reference = (op_a[rows].double() * op_b[:, cols].t().double()).sum(dim=1)
    got = c[rows, cols].double()
    largest = reference.abs().max().item()
    error = (got - reference).abs()
    worst = int(error.argmax().item())
    if not bool((error <= tolerance * largest).all().item()):
        fail("validation: %s %s: torch's c[%d, %d] = %.6g, float64 reference %.6g, tolerance %.3g "
             "(%g of the largest sampled |c|)" % (dtype_name, name, rows[worst].item(), cols[worst].item(),
                                                 got[worst].item(), reference[worst].item(),
                                                 tolerance * largest, tolerance))


def run_dtype(dtype_name, shapes, args):
    dtype, _, tolerance = DTYPES[dtype_name]
    device = torch.device(DEVICE)
    max_a = max(m * k for _, m, n, k, _, _, _ in shapes)
    max_b = max(k * n for _, m, n, k, _, _, _ in shapes)
    max_c = max(m * n for _, m, n, k, _, _, _ in shapes)
    # Multiples of 1/128 in [-1, 1), exact in bf16, like gemm_bench's inputs.
    gen = torch.Generator(device=device).manual_seed(1)
    buffers = {
        "a": torch.randint(-128, 128, (max_a,), generator=gen, device=device, dtype=torch.int16).to(dtype) / 128,
        "b": torch.randint(-128, 128, (max_b,), generator=gen, device=device, dtype=torch.int16).to(dtype) / 128,
        "c": torch.empty(max_c, device=device, dtype=dtype),
    }
    iterations = []
    for shape in shapes:
        op_a, op_b, c = operands(buffers, shape)
        c.fill_(float("nan"))
        torch.matmul(op_a, op_b, out=c)
        torch.cuda.synchronize()
        validate(shape[0], dtype_name, tolerance, op_a, op_b, c)
        for _ in range(max(1, args.warmup)):
            torch.matmul(op_a, op_b, out=c)
        probe = time_per_call_ms(lambda: torch.matmul(op_a, op_b, out=c), 3)
        iterations.append(int(min(1e6, max(args.min_iters, -(-args.min_ms // max(probe, 1e-6))))))

    times = [[] for _ in shapes]
    for _ in range(args.repeats):
        for i, shape in enumerate(shapes):
            op_a, op_b, c = operands(buffers, shape)
            for _ in range(args.warmup):
                torch.matmul(op_a, op_b, out=c)
            times[i].append(time_per_call_ms(lambda: torch.matmul(op_a, op_b, out=c), iterations[i]))
    del buffers
    torch.cuda.empty_cache()
    return iterations, times


def print_table(dtype_name, shapes, iterations, times, repeats):
    print("\n== %s: %s (torch.matmul) ==" % (dtype_name, DTYPES[dtype_name][1]))
    print("%-14s %6s %6s %6s %2s %2s %4s %6s | %9s %8s | %-21s" % (
        "shape", "M", "N", "K", "tA", "tB", "step", "calls", "torch ms", "TFLOP/s",
        "[min-max ms of %d]" % repeats))
    for shape, calls, t in zip(shapes, iterations, times):
        name, m, n, k, ta, tb, per_step = shape
        ms = statistics.median(t)
        print("%-14s %6d %6d %6d %2s %2s %4d %6d | %9.3f %8.1f | [%.3f-%.3f]" % (
            name, m, n, k, "T" if ta else "N", "T" if tb else "N", per_step, calls, ms,
            tflops(2.0 * m * n * k, ms), min(t), max(t)))
    for per_step in (False, True):
        flops = 0.0
        totals = [0.0] * repeats
        for shape, t in zip(shapes, times):
            _, m, n, k, _, _, step = shape
            count = step if per_step else 1
            flops += count * 2.0 * m * n * k
            for r in range(repeats):
                totals[r] += count * t[r]
        ms = statistics.median(totals)
        label = "total, 1 step" if per_step else "total, each 1x"
        print("%-14s %38s | %9.3f %8.1f | [%.3f-%.3f]" % (
            label, "(x step count)" if per_step else "", ms, tflops(flops, ms), min(totals), max(totals)))
        if per_step:
            print("RESULT dtype=%s torch_ms=%.4f torch_tflops=%.2f torch_ms_min=%.4f torch_ms_max=%.4f" % (
                dtype_name, ms, tflops(flops, ms), min(totals), max(totals)))


def main():
    sys.stdout.reconfigure(line_buffering=True)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=["f32", "bf16", "both"], default="both")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--min_iters", type=int, default=20)
    parser.add_argument("--min_ms", type=float, default=20.0)
    parser.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    args = parser.parse_args()
    if args.repeats < 1 or args.min_iters < 1:
        fail("--repeats and --min_iters must be >= 1")

    shapes = gpt2_training_shapes()
    if args.shapes:
        by_name = {s[0]: s for s in shapes}
        wanted = [w for w in args.shapes.split(",") if w]
        for w in wanted:
            if w not in by_name:
                fail("--shapes: no shape '%s'; the shapes are %s" % (w, ",".join(by_name)))
        shapes = [by_name[w] for w in wanted]

    if not torch.cuda.is_available():
        fail("no CUDA device: torch.cuda.is_available() is False (torch %s, built for CUDA %s)" % (
            torch.__version__, torch.version.cuda))
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    print("gemm_torch: the GEMMs of a GPT-2 124M training step, 8 x 1024 tokens (attention's batched GEMMs "
          "left out)")
    print("date: %s" % datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))
    print("GPU 0: %s, sm_%d%d, %d SMs, %d MiB" % (props.name, props.major, props.minor,
                                                  props.multi_processor_count, props.total_memory >> 20))
    try:
        blas = str(torch.backends.cuda.preferred_blas_library())
    except (AttributeError, RuntimeError):
        blas = "unknown"
    try:
        bf16_reduction = str(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)
    except (AttributeError, AssertionError):
        bf16_reduction = "unknown"
    print("torch %s, CUDA %s, preferred BLAS %s; allow_tf32=%s, allow_bf16_reduced_precision_reduction=%s" % (
        torch.__version__, torch.version.cuda, blas, torch.backends.cuda.matmul.allow_tf32, bf16_reduction))
    print("each timing: %d warm-up calls, then >= %d back-to-back torch.matmul(a, b, out=c) calls and >= %g ms "
          "between CUDA events; %d repeats; ms = median over repeats" % (
              args.warmup, args.min_iters, args.min_ms, args.repeats))
    print("TFLOP/s = 2 M N K / time per GEMM; step = runs per training step. Eager torch pays Python and "
          "dispatch per call (some us): a shape near that is host-bound")

    for dtype_name in (["f32", "bf16"] if args.dtype == "both" else [args.dtype]):
        iterations, times = run_dtype(dtype_name, shapes, args)
        print_table(dtype_name, shapes, iterations, times, args.repeats)


if __name__ == "__main__":
    main()
