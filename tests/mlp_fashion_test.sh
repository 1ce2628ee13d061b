#!/usr/bin/env bash
# The README's first command, as written: the MLP example must reach the
# Fashion-MNIST benchmark table's 0.883 test accuracy (MLP 256-128-100).
set -euo pipefail
strata=$1
example=$2
metrics=${TEST_TMPDIR:-/tmp}/mlp_fashion_metrics.jsonl
"$strata" run "$example" --data fashion_mnist --epochs 10 --eval_data fashion_mnist:test --metrics "$metrics" --quiet
final=$(grep '"eval"' "$metrics" | tail -1)
echo "final evaluation: $final"
acc=$(echo "$final" | sed -E 's/.*"accuracy": ([0-9.eE+-]+).*/\1/')
steps=$(grep -c '^{"step"' "$metrics")
[ "$steps" -eq 9370 ] || { echo "expected 9370 steps (10 epochs of 937), got $steps"; exit 1; }
/usr/bin/python3 -c "import sys; a=float('$acc'); print('test accuracy', a); sys.exit(0 if a >= 0.883 else 1)"
