#!/usr/bin/env bash
# The GPU checks as one prepared call, for a GPU machine that has torch, transformers, numpy,
# safetensors, tokenizers and pytest but nothing else of ours, and no network (see docs/benchmarks.md, "What has
# run on a GPU").
#
#   bash benchmarks/gpu_check.sh fetch   # here, with the network: the wheels it lacks, into gpu-wheels/
#   bash benchmarks/gpu_check.sh         # there (carry gpu-wheels/, a few MiB)
#
# Under 5 minutes on one H100 (GPU_CHECK_BUDGET_S, 285 s: each step's timeout is cut to what is left,
# and a step with under 15 s left is skipped). Each step writes its output to its own file in $OUT
# (the device tool brings that folder back), else gpu-check/, as it runs; benchmarks.gpu also appends
# each section's JSON line to gpu-<shape>.jsonl the moment the section ends. steps.txt says how each
# step ended. In order:
#   a-runner-tests   the runner's CUDA graphs against the eager step (every shape and dtype)
#   b-qwen2.5-1.5b   the 1.5B shape: graphs captured, capture time and memory; the kernels of a decoding
#                    step (in all and per layer); one step replayed, timed with CUDA events, at
#                    (batch, length) 1x256, 8x256, 32x256, 1x1024, with the profiler's kernel count,
#                    against the engine's step there; the forward of the 762-token prefill against the
#                    engine's TTFT; then TTFT, streams, batched-equals-solo
#   c-smollm2-135m   the same benchmark sections for the 135M shape
#   d-, e-transformers-<shape>   transformers' generate and ContinuousBatchingManager for each shape,
#                    last (their ratios from the engine's streams in gpu-<shape>.jsonl)
#   f-generic-path-tests  the forward's solo-against-batched tests in every dtype, if 60 s are left
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=gpu-wheels
DEPS=/tmp/gw-deps
# What the tests and benchmarks import beyond that machine's packages, at the versions this repository's
# tests run with. pytest comes too: pytest-asyncio 1.x needs pytest >= 8.4 (and that, pluggy >= 1.6).
PURE=(pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0 packaging==26.4 pytest-asyncio==1.5.0
      gguf==0.19.0 exceptiongroup tomli 'backports-asyncio-runner>=1.1,<2')  # the last three: for Python 3.10
BINARY=(soxr==1.1.0)
BINARY_PYTHONS=(3.10 3.11 3.12)  # soxr's 3.12 wheel is abi3: 3.13 and later take it too
NEEDED=(pytest pluggy iniconfig pygments packaging pytest_asyncio gguf soxr)

if [ "${1:-}" = fetch ]; then
  rm -rf "$WHEELS" && mkdir -p "$WHEELS" || exit 1
  # Pure-Python wheels that take the oldest Python the binary ones do (tomli has compiled ones too).
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${BINARY_PYTHONS[0]}" --platform any \
    -d "$WHEELS" "${PURE[@]}" || exit 1
  for version in "${BINARY_PYTHONS[@]}"; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
      --platform manylinux_2_28_x86_64 -d "$WHEELS" "${BINARY[@]}" || exit 1
  done
  ls "$WHEELS" && du -sh "$WHEELS"
  exit 0
fi

BUDGET=${GPU_CHECK_BUDGET_S:-285}
out=${OUT:-gpu-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1  # a step cut off by its timeout keeps what it printed
status=0
log() { echo "[gpu_check +${SECONDS}s] $*" | tee -a "$out/steps.txt"; }

# step NAME SECONDS COMMAND...: COMMAND under `timeout`, cut to the budget left, its output in $out/NAME.txt.
step() {
  local name=$1 limit=$2 left rc
  shift 2
  left=$((BUDGET - SECONDS))
  if [ "$left" -lt 15 ]; then
    log "$name: skipped, ${left} s of the budget left"
    status=1
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  log "$name: started, timeout ${limit} s"
  timeout -k 5 "$limit" "$@" > "$out/$name.txt" 2>&1
  rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then log "$name: timed out after ${limit} s"; else log "$name: exit $rc"; fi
  tail -n 4 "$out/$name.txt"
  [ "$rc" = 0 ] || status=1
  return "$rc"
}

# The carried wheels, for the Python that runs here: each wheel is a zip; the ones whose tags this
# interpreter and machine take are unpacked into $DEPS (no pip needed). A package without one stops the run.
if [ -d "$WHEELS" ]; then
  rm -rf "$DEPS"
  "$PY" - "$WHEELS" "$DEPS" "${NEEDED[@]}" <<'PYEOF' 2>&1 | tee "$out/install.txt"
import platform, re, sys, zipfile
from pathlib import Path

wheels, target, needed = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
minor = sys.version_info.minor
libc = platform.libc_ver()[1] or "0.0"
glibc = tuple(int(x) for x in libc.split(".")[:2])


def rank(path):
    """How well this interpreter takes the wheel (higher is better), None where it cannot."""
    m = re.match(r"(?P<dist>.+?)-[^-]+(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$", path.name)
    if m is None or sys.version_info.major != 3:
        return None
    plats = m["plat"].split(".")
    if m["plat"] != "any":
        fits = [p for p in plats if p.endswith("_" + platform.machine())
                and (mg := re.match(r"manylinux_(\d+)_(\d+)_", p)) and (int(mg[1]), int(mg[2])) <= glibc]
        if not fits:
            return None
    best = None
    for tag in m["py"].split("."):
        if tag in ("py3", f"py3{minor}"):
            best = max(best or 0, 1)
        elif tag == f"cp3{minor}" and m["abi"] != "abi3":
            best = max(best or 0, 3)
        elif tag.startswith("cp3") and tag[3:].isdigit() and m["abi"] == "abi3" and int(tag[3:]) <= minor:
            best = max(best or 0, 2)
    return best


chosen = {}
for path in sorted(wheels.glob("*.whl")):
    r = rank(path)
    dist = path.name.split("-")[0].lower()
    if r is not None and r > chosen.get(dist, (0, None))[0]:
        chosen[dist] = (r, path)
missing = [n for n in needed if n.lower() not in chosen]
if missing:
    sys.exit(f"no wheel in {wheels} for Python 3.{minor} on {platform.machine()} glibc {libc}: {missing} "
             "(bash benchmarks/gpu_check.sh fetch on a machine with the network)")
target.mkdir(parents=True, exist_ok=True)
for dist, (_, path) in sorted(chosen.items()):
    with zipfile.ZipFile(path) as z:
        z.extractall(target)
    print("installed", path.name)
PYEOF
  [ "${PIPESTATUS[0]}" = 0 ] || { log "installing the carried wheels failed (see install.txt)"; exit 2; }
  export PYTHONPATH="$DEPS:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
# tests/conftest.py imports soxr (every test fails at collection without it), pyproject's asyncio_mode
# needs pytest-asyncio: stop here, not in every test.
"$PY" -c 'import soxr, pytest, pytest_asyncio; print("soxr", soxr.__version__, "pytest", pytest.__version__, "pytest-asyncio", pytest_asyncio.__version__)' \
  > "$out/imports.txt" 2>&1 || { cat "$out/imports.txt"; log "soxr or pytest-asyncio does not import (carry gpu-wheels/: bash benchmarks/gpu_check.sh fetch)"; exit 2; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
  cat "$out/imports.txt"
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

step a-runner-tests 90 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_model_runner.py
step b-qwen2.5-1.5b 80 "$PY" -m benchmarks.gpu --shape qwen2.5-1.5b \
  --sections capture,kernels,steps,prefill,ttft,streams,solo --buckets 1x256,8x256,32x256,1x1024 --out "$out"
step c-smollm2-135m 45 "$PY" -m benchmarks.gpu --shape smollm2-135m --sections capture,kernels,ttft,streams,solo \
  --buckets 1x256,8x256 --out "$out"
step d-transformers-qwen2.5-1.5b 35 "$PY" -m benchmarks.gpu --shape qwen2.5-1.5b --sections transformers --out "$out"
step e-transformers-smollm2-135m 25 "$PY" -m benchmarks.gpu --shape smollm2-135m --sections transformers --out "$out"
if [ $((BUDGET - SECONDS)) -ge 60 ]; then  # more checks while time is left; their end sets no status
  before=$status
  step f-generic-path-tests 300 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_generic_path.py
  status=$before
fi

for f in "$out"/gpu-*.jsonl; do
  [ -e "$f" ] && cut -c1-400 "$f"
done
log "done, status $status"
exit $status
