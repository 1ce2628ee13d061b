#!/usr/bin/env bash
# A tiny GPT from `strata gen gpt` (2 blocks, d_model 64, 4 heads, seq 32,
# byte-level vocab 256) trains on the license corpus through --data tokens:
# its loss starts near ln 256 and falls over 30 steps. And the GPT-2 124M
# sizes check with 124,439,808 parameters.
set -euo pipefail
strata=$1
corpus=$2
tmp=${TEST_TMPDIR:-$(mktemp -d)}

# GPT-2 124M's sizes: V*D + T*D + L*(12*D*D + 13*D) + 2*D parameters, wte tied.
"$strata" gen gpt --blocks 12 --d_model 768 --heads 12 --seq 1024 --vocab 50257 > "$tmp/gpt2.pbtxt"
"$strata" check "$tmp/gpt2.pbtxt" | tee "$tmp/check.txt"
grep -q "parameters: 124439808 " "$tmp/check.txt" || { echo "GPT-2 124M should have 124439808 parameters"; exit 1; }
# On 4 stages wte sits on the first and the last; it still counts once.
"$strata" gen gpt --blocks 12 --stages 4 > "$tmp/gpt2_pp4.pbtxt"
echo 'pipeline { micro_batch_size: 1 accumulate_steps: 8 schedule: ONE_F_ONE_B }' > "$tmp/pp4.strategy.pbtxt"
"$strata" check "$tmp/gpt2_pp4.pbtxt" --strategy "$tmp/pp4.strategy.pbtxt" | tee "$tmp/check4.txt"
grep -q "parameters: 124439808 " "$tmp/check4.txt" || { echo "GPT-2 124M on 4 stages: wte counted twice?"; exit 1; }

"$strata" gen gpt --blocks 2 --d_model 64 --heads 4 --seq 32 --vocab 256 --lr 2e-3 > "$tmp/gpt.pbtxt"
"$strata" check "$tmp/gpt.pbtxt"
"$strata" run "$tmp/gpt.pbtxt" --steps 30 --batch_size 16 --seed 3 --quiet --metrics "$tmp/m.jsonl" \
  --data "tokens:path=$corpus"
losses() { sed -nE 's/^\{"step": [0-9]+, "epoch": [0-9]+, "loss": ([0-9.eE+-]+).*/\1/p' "$1"; }
echo "losses: $(losses "$tmp/m.jsonl" | tr '\n' ' ')"
[ "$(losses "$tmp/m.jsonl" | wc -l)" -eq 30 ] || { echo "expected 30 steps"; exit 1; }
losses "$tmp/m.jsonl" | /usr/bin/python3 -c '
import math, sys
losses = [float(line) for line in sys.stdin]
first, last5 = losses[0], sum(losses[-5:]) / 5
print("first loss %.4f (ln 256 = %.4f), mean of the last 5 %.4f" % (first, math.log(256), last5))
if abs(first - math.log(256)) > 0.3:
    sys.exit("the first loss is not near ln 256")
if last5 > first - 1.5:
    sys.exit("the loss fell by less than 1.5 in 30 steps")
'
echo "ok"
