"""bench/gpt2: GPT-2 training steps (forward, backward, AdamW, the loss read
back each step), Strata against PyTorch on the same device in one run.

Strata: `strata gen gpt` writes the model (tied token embedding, pre-norm
blocks, causal scaled_dot_product_attention, 4x gelu MLP in GPT-2's tanh
form), `strata run
--device gpu` trains it under `mixed_precision { dtype: BF16 }` on synthetic
tokens; tokens/s from the metrics file's step_ms after the warm-up steps,
its peak from the run's 'measured peak' line.

PyTorch, the strong side: the same architecture and sizes in nn.Module form
(nanoGPT's), bf16 autocast, F.scaled_dot_product_attention(is_causal=True),
AdamW(fused=True) with Strata's hyper-parameters, tied embeddings, loss.item()
every step; 'eager' and 'compile' (torch.compile of the model). TF32 off on
both sides, or with --tf32 allowed on both (Strata's strategy gets
allow_tf32: true, which under bf16 reaches attention's float32 products;
torch.backends.cuda.matmul.allow_tf32).

Printed per side: median step ms over rounds, tokens/s, the ratio
strata tokens/s / torch tokens/s (> 1: Strata faster), with the spread of the
per-round ratios; the first step's loss on both sides (the same init
scheme, not the same draws: both near ln(vocab)); MFU
against the GPU's dense bf16 peak (6 N + 12 L T d FLOP per token, PaLM's
count, N without the position embedding); peak memory (Strata: allocated;
torch: max_memory_allocated).

Before the timing (unless --no_same_init), the same-weights check: torch's
initial weights written as a Strata checkpoint (model.safetensors, metadata
step 0, weights only: Linear weights transposed to [in, out], LayerNorm to
.g/.b, wte tied), B windows of seq+1 seeded random uint16 ids in one token
file, and each side's loss on them: `strata run --eval_only --load DIR
--eval_data tokens:path=FILE` against the torch module's forward under
no_grad (bf16 autocast with --dtype bf16). Printed: both losses, their
relative difference and whether it is within the tolerance (1e-5 float32,
1e-3 TF32, 1e-2 bf16; --same_init_tol).

On the GPU machine, from the repository root (strata_gpu bundled with
../shared/tools/device-bundle):
  python3 bench/gpt2.py --strata "bash .device/run.sh strata_gpu"
A smoke test of the script itself on a CPU (torch 1.13: eager only, no
fused AdamW, attention by hand):
  /usr/bin/python3 bench/gpt2.py --strata bazel-bin/tools/strata --device cpu \
      --blocks 2 --d_model 64 --heads 4 --seq 64 --vocab 256 --batch 4 --steps 4 --warmup 1 --rounds 1
"""

import argparse
import datetime
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

# Dense bf16 tensor-core peaks (FLOP/s) by device-name substring.
BF16_PEAK = [("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12)]


def bf16_peak(name):
    for key, peak in BF16_PEAK:
        if key in name:
            return peak
    return float("nan")


def flops_per_token(a):
    d, L, T, V = a.d_model, a.blocks, a.seq, a.vocab
    n = V * d + L * (12 * d * d + 13 * d) + 2 * d  # wte (tied), blocks, ln_f; wpe left out as PaLM does
    return 6 * n + 12 * L * T * d


def strata_program(a, workdir):
    """Writes `strata gen gpt`'s program and the strategy; (command, program path, strategy flags)."""
    cmd = shlex.split(a.strata)
    program = os.path.join(workdir, "gpt2.pbtxt")
    with open(program, "w") as f:
        gen = subprocess.run(cmd + ["gen", "gpt", "--blocks", str(a.blocks), "--d_model", str(a.d_model), "--heads",
                                    str(a.heads), "--seq", str(a.seq), "--vocab", str(a.vocab), "--gelu", "tanh"],
                             stdout=f, stderr=subprocess.PIPE, text=True)
    if gen.returncode != 0:
        raise SystemExit("bench: strata gen gpt failed: " + gen.stderr)
    fields = ("mixed_precision { dtype: BF16 }\n" if a.dtype == "bf16" else "") + ("allow_tf32: true\n" if a.tf32 else "")
    strategy = []  # float32 without TF32: no strategy file (an empty one is refused)
    if fields:
        strategy = ["--strategy", os.path.join(workdir, "strategy.pbtxt")]
        with open(strategy[1], "w") as f:
            f.write(fields)
    return cmd, program, strategy


def strata_side(a, workdir):
    cmd, program, strategy = strata_program(a, workdir)
    metrics = os.path.join(workdir, "metrics.jsonl")
    argv = cmd + ["run", program] + strategy + ["--device", a.device, "--data", "synthetic",
                  "--steps", str(a.warmup + a.steps), "--batch_size", str(a.batch), "--metrics", metrics, "--quiet",
                  "--cuda_graph=%s" % ("false" if a.no_cuda_graph else "true")] + shlex.split(a.strata_flags)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise SystemExit("bench: %s exited with %d:\n%s" % (" ".join(argv), p.returncode, p.stdout))
    with open(metrics) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    steps = [l for l in lines if "step_ms" in l]
    ms = statistics.median(l["step_ms"] for l in steps[a.warmup:])
    for note in re.findall(r"note: (?:--cuda_graph: |cuBLASLt ).*", p.stdout):
        print("strata " + note)
    peak = re.search(r"measured peak ([0-9.]+) (B|KiB|MiB|GiB)", p.stdout)
    unit = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    peak_bytes = float(peak.group(1)) * unit[peak.group(2)] if peak else float("nan")
    if a.strata_metrics:
        shutil.copyfile(metrics, a.strata_metrics)
    return ms, steps[0]["loss"], steps[-1]["loss"], peak_bytes


def torch_device(a):
    import torch

    dev = torch.device("cuda" if a.device == "gpu" else "cpu")
    if dev.type == "cpu":
        torch.set_num_threads(os.cpu_count())  # Debian's torch starts with 1; strata run uses every core
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
    return dev


def torch_model(a, dev):
    """nanoGPT's GPT-2 module, initialised from torch.manual_seed(0)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    d, H, T, V, L = a.d_model, a.heads, a.seq, a.vocab, a.blocks
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.fc_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            B = x.shape[0]
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
            if sdpa is not None:
                y = sdpa(q, k, v, is_causal=True)
            else:  # torch < 2.0 (the CPU smoke test only)
                s = (q @ k.transpose(-2, -1)) / math.sqrt(d // H)
                s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
                y = s.softmax(-1) @ v
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
            # GPT-2's gelu_new, as `strata gen gpt --gelu tanh` writes it.
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, d), nn.Embedding(T, d)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(d)
            for name, p in self.named_parameters():
                if name.endswith("proj.weight"):
                    nn.init.normal_(p, std=0.02 / math.sqrt(2 * L))
                elif p.dim() == 2:
                    nn.init.normal_(p, std=0.02)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, tokens, targets):
            x = self.wte(tokens) + self.wpe.weight
            for b in self.blocks:
                x = b(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    return GPT().to(dev)


def torch_side(a, variant):
    import torch

    dev = torch_device(a)
    V, T = a.vocab, a.seq
    model = torch_model(a, dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    fused = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, **fused)
    step_model = torch.compile(model) if variant == "compile" else model
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, V, (a.batch, T), generator=g).to(dev),
                torch.randint(0, V, (a.batch, T), generator=g).to(dev)) for _ in range(2)]
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    import time
    times, first_loss = [], None
    for i in range(a.warmup + a.steps):
        tokens, targets = batches[i % 2]
        sync()
        t0 = time.perf_counter()
        with amp:
            loss = step_model(tokens, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()
        sync()
        if first_loss is None:
            first_loss = value
        if i >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else float("nan")
    return statistics.median(times), first_loss, peak


def strata_checkpoint(model, folder):
    """Writes the torch model's weights as a flat Strata checkpoint, folder/model.safetensors
    (runtime/checkpoint.h: 8-byte little-endian header length, JSON header padded with spaces
    to 8 bytes, then the tensors back to back in name order; metadata "step" is required).
    Only the weights: --eval_only does not need the optimizer's '@' state."""
    import numpy as np

    names = {"wte.weight": "wte", "wpe.weight": "wpe", "ln_f.weight": "ln_f.g", "ln_f.bias": "ln_f.b"}
    block = {"ln1.weight": "ln1.g", "ln1.bias": "ln1.b", "ln2.weight": "ln2.g", "ln2.bias": "ln2.b",
             "qkv.weight": "attn.qkv.w", "qkv.bias": "attn.qkv.b", "proj.weight": "attn.proj.w",
             "proj.bias": "attn.proj.b", "fc.weight": "mlp.fc.w", "fc.bias": "mlp.fc.b",
             "fc_proj.weight": "mlp.proj.w", "fc_proj.bias": "mlp.proj.b"}
    tensors = {}
    for name, p in model.named_parameters():  # wte once: the LM head is tied to it
        if name.startswith("blocks."):
            _, i, rest = name.split(".", 2)
            target = "block%s.%s" % (i, block[rest])
        else:
            target = names[name]
        w = p.detach().float().cpu()
        # torch's Linear weight is [out, in] (y = x @ W^T); Strata's matmul weight is [in, out].
        # qkv's 3d columns stay in torch's order: q|k|v, each split into heads of d/H (split then view).
        if target.endswith(".w"):
            w = w.t()
        tensors[target] = np.ascontiguousarray(w.numpy(), dtype="<f4")
    header, offset = {"__metadata__": {"step": "0"}}, 0
    for name in sorted(tensors):
        t = tensors[name]
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name in sorted(tensors):
            f.write(tensors[name].data)
    return sum(t.size for t in tensors.values())


def same_init_check(a, workdir):
    """Both sides' loss on the same initial weights (torch's, loaded into Strata with --load)
    and the same B windows of seq+1 token ids: the initial loss compared as one computation."""
    import numpy as np
    import torch

    dev = torch_device(a)
    model = torch_model(a, dev)
    if a.same_init_scale != 1:
        # At init (std 0.02) attention is nearly uniform: q and k swapped moved the small model's loss
        # by 8e-6 relative, within float32's tolerance. Scaled matrices make the layout show (GPT-2 x3:
        # 1.1e-3); much more (x10) and 12 blocks amplify float32's rounding past 1e-5.
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.mul_(a.same_init_scale)
    folder = os.path.join(workdir, "same_init")
    n = strata_checkpoint(model, folder)
    windows = np.random.default_rng(2).integers(0, a.vocab, size=(a.batch, a.seq + 1), dtype=np.int64)
    token_file = os.path.join(workdir, "same_init.tokens")
    windows.astype("<u2").tofile(token_file)
    # Strata: one evaluation of the loaded weights over the file's B windows (one batch).
    cmd, program, strategy = strata_program(a, workdir)
    metrics = os.path.join(workdir, "same_init.jsonl")
    argv = cmd + ["run", program] + strategy + ["--eval_only", "--load", folder, "--eval_data",
                  "tokens:path=" + token_file, "--batch_size", str(a.batch), "--device", a.device, "--quiet",
                  "--metrics", metrics] + shlex.split(a.strata_flags)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise SystemExit("bench: %s exited with %d:\n%s" % (" ".join(argv), p.returncode, p.stdout))
    with open(metrics) as f:
        evals = [l for l in (json.loads(l) for l in f if l.strip()) if "eval" in l]
    if len(evals) != 1 or evals[0]["loss"] is None:
        raise SystemExit("bench: expected one finite eval line in %s:\n%s" % (metrics, p.stdout))
    s_loss = evals[0]["loss"]
    # Torch: the same model's forward, inputs the first seq ids of each window, targets the last seq.
    w = torch.from_numpy(windows).to(dev)
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")
    with torch.no_grad(), amp:
        t_loss = model(w[:, :-1].contiguous(), w[:, 1:].contiguous()).item()
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    rel = abs(s_loss - t_loss) / abs(t_loss)
    # float32 agrees to rounding (CPU: 9e-8); bf16 and TF32 round the products' inputs.
    tol = a.same_init_tol or (1e-2 if a.dtype == "bf16" else 1e-3 if a.tf32 else 1e-5)
    ok = rel <= tol
    print("same weights and tokens: strata %.5f torch %.5f rel %.1e (%s%s, %d weights%s, %d windows of %d ids, "
          "ln(vocab) %.5f); expected rel <= %.0e: %s" % (
              s_loss, t_loss, rel, "bf16" if a.dtype == "bf16" else "float32", ", TF32" if a.tf32 else "", n,
              ", matrices x%g" % a.same_init_scale if a.same_init_scale != 1 else "", a.batch, a.seq + 1,
              math.log(a.vocab), tol, "holds" if ok else "FAILS"))
    print("RESULT model=gpt2 check=same_init dtype=%s scale=%g strata_loss=%.6f torch_loss=%.6f rel=%.3e tol=%.0e "
          "ok=%d" % (a.dtype, a.same_init_scale, s_loss, t_loss, rel, tol, ok))
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True, help="command that runs strata (strata_gpu for --device gpu)")
    ap.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--d_model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="eager,compile")
    ap.add_argument("--no_cuda_graph", action="store_true",
                    help="Strata's steps eager (--cuda_graph=false) instead of one captured step replayed")
    ap.add_argument("--strata_metrics", default="",
                    help="keep Strata's --metrics file (the last round's) here, e.g. to set two variants' losses "
                         "side by side with tools/compare_metrics.py")
    ap.add_argument("--strata_flags", default="",
                    help="more flags for strata run, e.g. '--disable_passes fold-casts' (shell words)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"],
                    help="bf16: mixed_precision { dtype: BF16 } against bf16 autocast; f32: float32 on both sides")
    ap.add_argument("--no_same_init", action="store_true",
                    help="skip the same-weights check (torch's initial weights loaded into Strata with --load, "
                         "one batch of the same tokens evaluated on both sides)")
    ap.add_argument("--same_init_tol", type=float, default=0,
                    help="the same-weights check's relative tolerance (0: 1e-5 float32, 1e-3 TF32, 1e-2 bf16)")
    ap.add_argument("--same_init_scale", type=float, default=1,
                    help="multiply the checked model's matrices by this (e.g. 3: attention far from uniform, so "
                         "a q/k or head layout error shows); 1: the initial weights as drawn")
    ap.add_argument("--tf32", action="store_true",
                    help="allow TF32 on both sides (Strata's allow_tf32: attention's float32 products; "
                         "torch.backends.cuda.matmul.allow_tf32)")
    a = ap.parse_args()
    import torch
    variants = a.variants.split(",")
    for v in variants:
        if v not in ("eager", "compile"):
            raise SystemExit("error: --variants: unknown '%s' (expected eager,compile)" % v)
    if a.device == "cpu":
        variants = [v for v in variants if v == "eager" or hasattr(torch, "compile")]
    name = torch.cuda.get_device_name(0) if a.device == "gpu" else "cpu"
    tokens = a.batch * a.seq
    print("gpt2: %s, torch %s, %s UTC; %d blocks, d_model %d, %d heads, seq %d, vocab %d, batch %d (%d tokens a "
          "step); %s, AdamW, TF32 %s on both sides; %d rounds of %d steps after %d warm-up" % (
              name, torch.__version__, datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
              a.blocks, a.d_model, a.heads, a.seq, a.vocab, a.batch, tokens,
              "bf16 mixed precision" if a.dtype == "bf16" else "float32", "allowed" if a.tf32 else "off",
              a.rounds, a.steps, a.warmup))
    s_ms, t_ms = [], {v: [] for v in variants}
    s_loss = s_peak = None
    t_loss, t_peak = {}, {}
    with tempfile.TemporaryDirectory() as workdir:
        same_ok = True
        if not a.no_same_init:
            # A check that fails (or cannot run) is said, the timing still runs, and the script exits 1 at the end.
            try:
                same_ok = same_init_check(a, workdir)
            except SystemExit as e:
                print("same weights and tokens: FAILS, the check could not run: %s" % e)
                same_ok = False
        for _ in range(a.rounds):
            ms, s_loss, s_last, s_peak = strata_side(a, workdir)
            s_ms.append(ms)
            for v in variants:
                ms, t_loss[v], t_peak[v] = torch_side(a, v)
                t_ms[v].append(ms)
    peak = bf16_peak(name)
    fpt = flops_per_token(a)
    s = statistics.median(s_ms)
    mfu = lambda ms: fpt * tokens / (ms * 1e-3) / peak
    print("%-13s | %9s %10s %6s | %11s | %10s" % ("side", "step ms", "tokens/s", "MFU", "first loss", "peak"))
    print("%-13s | %9.2f %10.0f %5.1f%% | %11.4f | %7.0f MiB" % ("strata", s, tokens / s * 1e3, 100 * mfu(s), s_loss,
                                                            s_peak / (1 << 20)))
    # The first loss is the first forward's; the last one has run every backward and update.
    print("strata last loss (step %d): %.6f" % (a.warmup + a.steps, s_last))
    for v in variants:
        t = statistics.median(t_ms[v])
        print("%-13s | %9.2f %10.0f %5.1f%% | %11.4f | %7.0f MiB" % ("torch-" + v, t, tokens / t * 1e3, 100 * mfu(t),
                                                                t_loss[v], t_peak[v] / (1 << 20)))
    for v in variants:
        t = statistics.median(t_ms[v])
        ratios = [tv / sv for tv, sv in zip(t_ms[v], s_ms)]
        print("strata/torch-%s tokens/s: %.2fx [%.2f-%.2f]" % (v, t / s, min(ratios), max(ratios)))
        print("RESULT model=gpt2 side=%s strata_ms=%.3f torch_ms=%.3f ratio=%.3f ratio_min=%.3f ratio_max=%.3f "
              "strata_mfu=%.4f strata_peak_mib=%.0f torch_peak_mib=%.0f" % (
                  v, s, t, t / s, min(ratios), max(ratios), mfu(s), s_peak / (1 << 20), t_peak[v] / (1 << 20)))
    if not same_ok:
        sys.exit("bench: the same-weights check failed (above); the timings stand, the models may differ")


if __name__ == "__main__":
    main()
