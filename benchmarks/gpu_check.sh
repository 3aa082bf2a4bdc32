#!/usr/bin/env bash
# The GPU checks as one prepared call, for a GPU machine that has torch, transformers, numpy,
# safetensors, tokenizers and pytest but nothing else of ours (see README, "What has run on a GPU").
#
#   bash benchmarks/gpu_check.sh fetch   # here, with the network: the missing wheels into gpu-wheels/
#   bash benchmarks/gpu_check.sh         # there (carry gpu-wheels/): the GPU suite, then the benchmark
#
# Under 8 minutes on one H100: the engine's GPU tests in every dtype over every shape (4 layers
# each), then benchmarks.gpu for the 1.5B and the 135M shapes (28 and 30 layers, bfloat16).
# Results go to $OUT (the device tool brings that folder back), else to gpu-check/.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=gpu-wheels
# What the engine's tests import beyond that machine's packages (pure-Python or manylinux wheels).
MISSING=(pytest-asyncio soxr gguf)

if [ "${1:-}" = fetch ]; then
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  exec python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any -d "$WHEELS" "${MISSING[@]}"
fi

out=${OUT:-gpu-check}
mkdir -p "$out"
if [ -d "$WHEELS" ]; then
  python3 -m pip install -q --no-deps --target /tmp/gw-deps "$WHEELS"/*.whl
  export PYTHONPATH="/tmp/gw-deps:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

status=0
timeout 270 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine 2>&1 | tee "$out/pytest.txt" | tail -25
[ "${PIPESTATUS[0]}" = 0 ] || status=1
for shape in qwen2.5-1.5b smollm2-135m; do
  timeout 100 python3 -m benchmarks.gpu --shape "$shape" --repeats 3 > "$out/bench-$shape.json" 2> "$out/bench-$shape.err" \
    || { status=1; tail -5 "$out/bench-$shape.err"; }
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(sys.argv[2], json.dumps({k: r[k] for k in ("1_ttft", "3_versus_transformers")})); print({n: s["aggregate_tok_s"] for n, s in r["2_streams"].items()})' \
    "$out/bench-$shape.json" "$shape" 2>/dev/null || true
done
exit $status
