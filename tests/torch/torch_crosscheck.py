#!/usr/bin/python3
"""PyTorch's side of the cross-check (the driver is torch_crosscheck_driver.cc).

For each case folder the driver wrote, this script builds the model from the
program itself (a small interpreter over the program's ops, on torch
functions), loads Strata's initial weights, trains the same 20 batches with
torch.optim and torch.nn.utils.clip_grad_norm_, and compares with Strata:

  loss error    |strata - torch| / |torch| per step
  weight error  max|strata - torch| / max|torch| per parameter (the relative
                error in the max norm, so weights near zero do not inflate it)

Every error must be <= the case's tolerance (1e-9 for F64 programs, 1e-4 for
F32, BF16 mixed precision included: a case with "mixed_precision": "BF16"
runs torch's forward under torch.autocast("cpu", dtype=torch.bfloat16)). A
case with "F16" emulates F16 matmuls by casts and scales the loss by
GradScaler's rule; its per-step scales and skipped steps must equal Strata's.
Exits 1 on any mismatch, printing the worst steps and parameters.
Run with /usr/bin/python3 (Debian's torch): python3 torch_crosscheck.py DIR
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

_NP_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "BOOL": np.bool_}
_TORCH_DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64}


def read_safetensors(path):
    """{name: np.ndarray} from a safetensors file (the format runtime/checkpoint.h writes)."""
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = blob[8 + header_len:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = np.dtype(_NP_DTYPES[info["dtype"]]).newbyteorder("<")
        out[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(info["shape"]).copy()
    return out


# --------------------------------------------------------------------------
# The program interpreter: each op's semantics as its schema documents them.

def _attr(op, key, default):
    """An op attr from the program's JSON (int64 values arrive as strings)."""
    a = op.get("attr", {}).get(key)
    if a is None:
        return default
    if "i" in a:
        return int(a["i"])
    if "f" in a:
        return float(a["f"])
    if "b" in a:
        return bool(a["b"])
    if "s" in a:
        return a["s"]
    if "list" in a:
        lst = a["list"]
        if "i" in lst:
            return [int(v) for v in lst["i"]]
        if "f" in lst:
            return [float(v) for v in lst["f"]]
        if "s" in lst:
            return list(lst["s"])
        return []
    return default


def _pair(v):
    return tuple(v) if len(v) == 2 else (v[0], v[0])


# F16 mixed precision as Strata's pass and widened kernels run it: every
# matmul on F16 copies of its inputs, float32 math, its output rounded to F16
# (CPU torch 1.13 has no half matmul). The casts' backward rounds the
# gradients alike: dy to F16 before the matmul's backward, da and db after.
_F16_MATMUL = [False]


def _f16(t):
    return t.half().float()


def _matmul(op, a, b):
    if _attr(op, "transpose_a", False):
        a = a.transpose(-1, -2)
    if _attr(op, "transpose_b", False):
        b = b.transpose(-1, -2)
    if _F16_MATMUL[0]:
        return _f16(torch.matmul(_f16(a), _f16(b)))
    return torch.matmul(a, b)


def _conv2d(op, x, w):
    return F.conv2d(x, w, None, stride=_pair(_attr(op, "strides", [1, 1])), padding=_pair(_attr(op, "paddings", [0, 0])),
                    dilation=_pair(_attr(op, "dilations", [1, 1])), groups=_attr(op, "groups", 1))


def _pool_args(op):
    kernel = _pair(_attr(op, "kernel_size", None))
    strides = _attr(op, "strides", [])
    return kernel, (_pair(strides) if strides else kernel), _pair(_attr(op, "paddings", [0, 0]))


def _max_pool2d(op, x):
    k, s, p = _pool_args(op)
    return F.max_pool2d(x, k, s, p)


def _avg_pool2d(op, x):
    k, s, p = _pool_args(op)
    # exclusive: padding is left out of the divisor.
    return F.avg_pool2d(x, k, s, p, count_include_pad=not _attr(op, "exclusive", False))


def _flatten(op, x):
    return torch.flatten(x, _attr(op, "start_axis", 1), _attr(op, "end_axis", -1))


def _layer_norm(op, x, gamma, beta):
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps=_attr(op, "epsilon", 1e-5))


def _accuracy(op, logits, label):
    # A sample counts when fewer than k logits are strictly greater than its label's.
    k = _attr(op, "k", 1)
    picked = logits.gather(-1, label.unsqueeze(-1))
    return ((logits > picked).sum(-1) < k).to(logits.dtype).mean()


def _dropout(op, x):
    if _attr(op, "p", 0.5) != 0:
        raise NotImplementedError("dropout with p > 0: Strata's Philox masks are not reproduced here")
    return x


OPS = {
    "matmul": _matmul,
    "add": lambda op, x, y: x + y,
    "sub": lambda op, x, y: x - y,
    "mul": lambda op, x, y: x * y,
    "div": lambda op, x, y: x / y,
    "scale": lambda op, x: x * _attr(op, "scale", 1.0) + _attr(op, "bias", 0.0),
    "relu": lambda op, x: torch.relu(x),
    "gelu": lambda op, x: F.gelu(x, approximate=_attr(op, "approximate", "none")),  # "none": the erf form
    "tanh": lambda op, x: torch.tanh(x),
    "sigmoid": lambda op, x: torch.sigmoid(x),
    "identity": lambda op, x: x,
    "conv2d": _conv2d,
    "max_pool2d": _max_pool2d,
    "avg_pool2d": _avg_pool2d,
    "flatten": _flatten,
    "reshape": lambda op, x: x.reshape([x.shape[0] if d == -1 else d for d in _attr(op, "shape", None)]),
    "layer_norm": _layer_norm,
    "softmax_cross_entropy": lambda op, logits, label: F.cross_entropy(logits, label),  # mean over the batch
    "mse_loss": lambda op, pred, target: F.mse_loss(pred, target),
    "accuracy": _accuracy,
    "dropout": _dropout,
}


class ProgramModel:
    """Runs a Strata program's ops on torch tensors; parameters are leaves."""

    def __init__(self, program, init):
        self.program = program
        self.ops = program["op"]
        for op in self.ops:
            if op["type"] not in OPS:
                raise NotImplementedError("no torch translation for op '%s'" % op["type"])
        self.params = {}  # name -> torch leaf, in declaration order
        for v in program["var"]:
            if v.get("kind") != "PARAM":
                continue
            # A copy: the optimizer updates it in place, and init stays the reference.
            t = torch.tensor(init[v["name"]], dtype=_TORCH_DTYPES[v["dtype"]])
            expected = [int(d) for d in v.get("shape", [])]
            if list(t.shape) != expected:
                raise ValueError("init of %s has shape %s, program says %s" % (v["name"], list(t.shape), expected))
            t.requires_grad_(not v.get("frozen", False))
            self.params[v["name"]] = t

    def trainable(self):
        return [t for t in self.params.values() if t.requires_grad]

    def forward(self, feeds):
        env = dict(self.params)
        env.update(feeds)
        for op in self.ops:
            outs = OPS[op["type"]](op, *[env[name] for name in op["input"]])
            if not isinstance(outs, tuple):
                outs = (outs,)
            for name, value in zip(op["output"], outs):
                env[name] = value
        return env[self.program["loss"]]


# --------------------------------------------------------------------------
# The optimizer section as torch.optim objects.

def lr_factor(schedule, total_steps):
    """Strata's lr_schedule (proto/program.proto, kernels/cpu/optimizers.cc) as a
    LambdaLR factor of t, the number of updates already made."""
    warmup = int(schedule.get("warmup_steps", 0))
    if "cosine" in schedule:
        c = schedule["cosine"]
        decay_end = int(c.get("decay_steps", 0)) or total_steps
        alpha = float(c.get("alpha", 0.0))

        def decay(t):
            span = decay_end - warmup
            if span <= 0:
                return alpha
            return alpha + (1 - alpha) * (1 + math.cos(math.pi * min(t, span) / span)) / 2
    elif "step_decay" in schedule:
        s = schedule["step_decay"]
        step_size, gamma = int(s.get("step_size", 0)), float(s.get("gamma", 0.0))

        def decay(t):
            return gamma ** (t // step_size)
    else:
        def decay(t):
            return 1.0

    def factor(t):
        if t < warmup:
            return (t + 1) / warmup  # linear warm-up from lr/warmup to lr
        return decay(t - warmup)
    return factor


def torch_scheduler_factors(schedule, total_steps):
    """Without warm-up, the same factors from torch's own schedulers (a check
    that lr_factor reads the proto as torch users would), else None."""
    if int(schedule.get("warmup_steps", 0)) != 0:
        return None
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=1.0)
    if "cosine" in schedule:
        c = schedule["cosine"]
        t_max = int(c.get("decay_steps", 0)) or total_steps
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=t_max, eta_min=float(c.get("alpha", 0.0)))
    elif "step_decay" in schedule:
        s = schedule["step_decay"]
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=int(s["step_size"]), gamma=float(s["gamma"]))
    else:
        return None
    factors = []
    for _ in range(total_steps):
        factors.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return factors


def make_optimizer(spec, params):
    wd = float(spec.get("weight_decay", 0.0))
    if "sgd" in spec:
        return torch.optim.SGD(params, lr=float(spec["sgd"]["learning_rate"]), weight_decay=wd)
    if "momentum" in spec:
        m = spec["momentum"]
        return torch.optim.SGD(params, lr=float(m["learning_rate"]), momentum=float(m.get("momentum", 0.0)),
                               nesterov=bool(m.get("nesterov", False)), weight_decay=wd)
    for kind, cls in (("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)):
        if kind in spec:
            a = spec[kind]
            return cls(params, lr=float(a["learning_rate"]),
                       betas=(float(a.get("beta1", 0.9)), float(a.get("beta2", 0.999))),
                       eps=float(a.get("epsilon", 1e-8)), weight_decay=wd)
    raise NotImplementedError("optimizer section %s" % json.dumps(spec))


# --------------------------------------------------------------------------

def relative_error(got, ref):
    """max|got - ref| / max|ref|: the relative error in the max norm."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-300))


class GradScalerRule:
    """torch.cuda.amp.GradScaler's scale and skip rule (CPU torch 1.13's
    GradScaler disables itself without CUDA, so its documented rule is
    written out): unscale by float32(1 / double(scale)), skip the step on
    any inf or nan, back off on a skip, grow after growth_interval good
    steps in a row (only to a finite float32)."""

    def __init__(self, cfg):
        self.scale = np.float32(cfg["init_scale"])
        self.growth, self.backoff = cfg["growth_factor"], cfg["backoff_factor"]
        self.interval = int(cfg["growth_interval"])
        self.good = 0

    def unscale_(self, params):
        """Unscales the gradients in place; returns found_inf."""
        inv = np.float32(1.0 / float(self.scale))
        found = False
        for p in params:
            found |= not bool(torch.isfinite(p.grad).all())
            p.grad.mul_(torch.tensor(inv, dtype=p.grad.dtype))
        return found

    def update(self, found):
        if found:
            self.scale = np.float32(float(self.scale) * self.backoff)
            self.good = 0
            return
        self.good += 1
        if self.good == self.interval:
            grown = np.float32(float(self.scale) * self.growth)
            if np.isfinite(grown):
                self.scale = grown
            self.good = 0


def train_torch(program, init, batches, steps, as_float64=False, mixed_precision="", loss_scaling=None,
                scaling_log=None):
    """Trains the program in torch for `steps` steps; returns (losses, final
    parameters as numpy, steps on which clipping engaged). as_float64 runs an
    F32 program in float64 from the same (F32) weights and batches. With
    loss_scaling (F16), scaling_log gets each step's (scale, skipped)."""
    if as_float64:
        program = json.loads(json.dumps(program))
        for v in program["var"]:
            if v["dtype"] == "F32":
                v["dtype"] = "F64"
        batches = {k: (b.astype(np.float64) if b.dtype == np.float32 else b) for k, b in batches.items()}
    model = ProgramModel(program, init)
    spec = program.get("optimizer", {})
    opt = make_optimizer(spec, model.trainable())
    schedule = spec.get("lr_schedule", {})
    factor = lr_factor(schedule, steps)
    theirs = torch_scheduler_factors(schedule, steps)
    if theirs is not None:
        ours = [factor(t) for t in range(steps)]
        worst = max(abs(a - b) for a, b in zip(ours, theirs))
        if worst > 1e-12:
            raise AssertionError("lr factors disagree with torch's scheduler by %.3g: %s vs %s" % (worst, ours, theirs))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    max_norm = float(spec.get("clip_global_norm", 0.0))

    scaler = GradScalerRule(loss_scaling) if loss_scaling else None
    feed_names = [v["name"] for v in program["var"] if v.get("kind") == "FEED"]
    losses, clipped_steps = [], 0
    for step in range(steps):
        feeds = {}
        for name in feed_names:
            key = "step%d.%s" % (step, name)
            if key in batches:
                feeds[name] = torch.from_numpy(batches[key])
        opt.zero_grad(set_to_none=True)
        if mixed_precision == "BF16":
            # torch 1.13's CPU autocast: matmul/mm/linear on bf16 casts of
            # their inputs, softmax and the losses in float32, as Strata's pass.
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model.forward(feeds)
        elif mixed_precision == "F16":
            _F16_MATMUL[0] = True
            try:
                loss = model.forward(feeds)
            finally:
                _F16_MATMUL[0] = False
        elif mixed_precision:
            raise NotImplementedError("mixed precision %s" % mixed_precision)
        else:
            loss = model.forward(feeds)
        if scaler is None:
            loss.backward()
            found = False
        else:
            # The backward seed is the scale (d(loss * S)/d(loss)).
            scale_used = float(scaler.scale)
            loss.backward(torch.tensor(scaler.scale, dtype=loss.dtype))
            found = scaler.unscale_(model.trainable())
        if max_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.trainable(), max_norm)
            clipped_steps += int(float(norm) > max_norm)
        if not found:
            # A skipped step is no optimizer step: neither the optimizer
            # (Adam's count) nor the lr schedule advance, as in Strata.
            opt.step()
            sched.step()
        if scaler is not None:
            scaler.update(found)
            scaling_log.append((scale_used, found))
        losses.append(float(loss))
    final = {name: t.detach().numpy().copy() for name, t in model.params.items()}
    return losses, final, clipped_steps


def run_case(folder):
    with open(os.path.join(folder, "case.json")) as f:
        case = json.load(f)
    with open(os.path.join(folder, "program.json")) as f:
        program = json.load(f)
    init = read_safetensors(os.path.join(folder, "init.safetensors"))
    batches = read_safetensors(os.path.join(folder, "batches.safetensors"))
    strata_final = read_safetensors(os.path.join(folder, "strata.safetensors"))
    steps = int(case["steps"])

    t0 = time.time()
    scaling_log = []
    losses, final, clipped_steps = train_torch(program, init, batches, steps,
                                               mixed_precision=case.get("mixed_precision", ""),
                                               loss_scaling=case.get("loss_scaling"), scaling_log=scaling_log)
    torch_seconds = time.time() - t0

    tol = float(case["tolerance"])
    loss_errors = [abs(s - t) / max(abs(t), 1e-300) for s, t in zip(case["losses"], losses)]
    weight_errors = {name: relative_error(strata_final[name], final[name]) for name in final}
    # How far training moved each parameter, relative to its scale: the errors
    # above only mean something if this is far larger.
    moved = {name: relative_error(final[name], init[name]) for name in final}
    result = {
        "case": case, "losses": losses, "loss_errors": loss_errors, "weight_errors": weight_errors,
        "tolerance": tol, "clipped_steps": clipped_steps, "clipping": float(program.get("optimizer", {}).get(
            "clip_global_norm", 0.0)) > 0, "moved": moved, "torch_seconds": torch_seconds, "float32_floor": None,
    }
    if case.get("loss_scaling"):
        # Every step's scale and skip decision, exactly.
        result["scaling"] = {"torch": scaling_log,
                             "strata": list(zip(case["loss_scaling"]["loss_scales"], case["loss_scaling"]["skipped"]))}
    failed = max(loss_errors) > tol or max(weight_errors.values()) > tol
    if failed and case["dtype"] == "F32" and not case.get("mixed_precision"):
        # Context for the failure: how far torch's own float32 run is from a
        # float64 one; if about as far as Strata, the case is ill-conditioned.
        _, final64, _ = train_torch(program, init, batches, steps, as_float64=True)
        result["float32_floor"] = {
            name: (relative_error(strata_final[name], final64[name]), relative_error(final[name], final64[name]))
            for name in final}
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", help="the driver's --out folder")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: the case's Strata threads)")
    args = parser.parse_args()
    torch.manual_seed(0)
    with open(os.path.join(args.dir, "cases.txt")) as f:
        names = [line.strip() for line in f if line.strip()]
    if not names:
        print("no cases in %s" % args.dir)
        return 1

    failures = []
    print("%-38s %-5s %12s %12s %9s  %s" % ("case", "dtype", "max loss err", "max w err", "tolerance", "notes"))
    for name in names:
        folder = os.path.join(args.dir, name)
        with open(os.path.join(folder, "case.json")) as f:
            threads = args.threads or int(json.load(f).get("threads", 1))
        torch.set_num_threads(max(threads, 1))
        try:
            r = run_case(folder)
        except Exception as e:  # a case torch cannot run is a failure, not a skip
            failures.append("%s: %s: %s" % (name, type(e).__name__, e))
            print("%-38s ERROR %s" % (name, e))
            continue
        tol = r["tolerance"]
        worst_loss = max(r["loss_errors"])
        worst_w_name = max(r["weight_errors"], key=r["weight_errors"].get)
        worst_w = r["weight_errors"][worst_w_name]
        notes = ["strata %.2fs torch %.2fs" % (r["case"]["strata_seconds"], r["torch_seconds"]),
                 "loss %.4f -> %.4f" % (r["losses"][0], r["losses"][-1]),
                 "weights moved >= %.1e" % min(r["moved"].values())]
        if r["clipping"]:
            notes.append("clipped %d/%d steps" % (r["clipped_steps"], len(r["losses"])))
        if "scaling" in r:
            theirs, ours = r["scaling"]["torch"], r["scaling"]["strata"]
            skipped = [i + 1 for i, (_, f) in enumerate(theirs) if f]
            notes.append("skipped steps %s, scales %s" % (skipped, sorted(set(int(s) for s, _ in theirs))))
            if [(float(s), bool(f)) for s, f in theirs] != [(float(s), bool(f)) for s, f in ours]:
                failures.append("%s: loss scales/skips differ:\n  torch  %s\n  strata %s" % (name, theirs, ours))
            grew = any(b[0] > a[0] for a, b in zip(theirs, theirs[1:]))
            if not skipped or all(f for _, f in theirs) or not grew:
                failures.append("%s: the case must skip some steps, make others and grow the scale: %s" %
                                (name, theirs))
        print("%-38s %-5s %12.3e %12.3e %9.0e  %s" % (name, r["case"]["dtype"], worst_loss, worst_w, tol,
                                                     ", ".join(notes)))
        bad_steps = [(i + 1, e) for i, e in enumerate(r["loss_errors"]) if not e <= tol]
        bad_weights = sorted(((e, n) for n, e in r["weight_errors"].items() if not e <= tol), reverse=True)
        if bad_steps or bad_weights:
            lines = ["%s: mismatch beyond %.0e" % (name, tol)]
            for step, e in bad_steps[:5]:
                lines.append("  step %d loss: strata %.17g torch %.17g (rel err %.3e)" %
                             (step, r["case"]["losses"][step - 1], r["losses"][step - 1], e))
            for e, n in bad_weights[:5]:
                lines.append("  weight %s: rel err %.3e" % (n, e))
            if r["float32_floor"]:
                lines.append("  against torch float64 from the same weights and batches (strata / torch float32):")
                for n, (es, et) in sorted(r["float32_floor"].items()):
                    lines.append("    %-24s %.3e / %.3e" % (n, es, et))
            failures.append("\n".join(lines))
        # A case that does not exercise what it claims to is a broken case.
        if r["clipping"] and r["clipped_steps"] == 0:
            failures.append("%s: clip_global_norm never engaged; lower it so the case tests clipping" % name)
        frozen = [n for n, d in r["moved"].items() if d == 0]
        if frozen:
            failures.append("%s: parameters never changed: %s" % (name, ", ".join(frozen)))

    if failures:
        print("\nFAILED:\n" + "\n".join(failures))
        return 1
    print("\nall %d cases agree with PyTorch" % len(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
