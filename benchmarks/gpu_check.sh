#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU, in at most 8 minutes (GPU_CHECK_BUDGET_S, default
# 480; every step gets what is left and the script stops when it runs out):
#   1. refuses at once, exit 2, where there is no CUDA GPU;
#   2. sets up what it needs from the repository: scripts/bootstrap.sh (.venv) and
#      scripts/setup-vllm.sh --cuda (.venv-vllm with vLLM for CUDA); both are idempotent, and a
#      fresh machine needs a package registry for them; then checks that both environments' torch
#      sees the GPU;
#   3. the default config on CUDA, the whole pipeline: vLLM on CUDA for rollout and evaluation,
#      training on CUDA (--set policy.device=cuda --set policy.engine=vllm);
#   4. the learning config's first steps through the train stage: configs/learn-arith.yaml
#      (--quick) when it exists, else the online k3-in-loss arm of configs/p5-kl-small.yaml
#      (--quick, 3 online iterations: sampling with vLLM on CUDA, weights loaded into the engine
#      after every batch, the sync canary checked each time);
#   5. prints, per run, sampling tokens/s, train seconds per step and tokens/s, and the
#      sampler/trainer log-prob agreement (max / mean |sampler - trainer| nats over the policy
#      tokens of every step, and the sync canary's max) beside the same figures of the CPU run of
#      the same config when its run folder exists (CPU_RUN_DEFAULT / CPU_RUN_LEARN, default: the
#      folder `harnessrl run` would use on the CPU; a fresh GPU machine has none unless those
#      folders are copied there); rows appended to benchmarks/results/gpu_check.jsonl.
# Run folders: runs/gpu-check/* (removed first: every run is fresh, never cached).
# Status: NOT YET RUN ON A GPU. It was written where no GPU was lent; the steps above are what it
# does, not measured results. Usage: benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-480}
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
step() {  # step NAME CMD...: run CMD with the time that is left, stop the check when none is
  local name=$1; shift
  local t; t=$(left)
  if [ "$t" -le 10 ]; then echo "gpu_check: out of time (${BUDGET} s) before: $name" >&2; exit 3; fi
  echo "gpu_check: $name (at most $t s)"
  if ! timeout "$t" "$@"; then echo "gpu_check: FAILED or out of time: $name" >&2; exit 1; fi
}

# 1. a CUDA GPU, or a clear refusal
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  echo "gpu_check: no CUDA GPU on this machine (nvidia-smi finds none); this check runs only where a GPU is lent" >&2
  exit 2
fi
nvidia-smi -L

# 2. the environments
step "setup .venv (scripts/bootstrap.sh)" ./scripts/bootstrap.sh
step "setup .venv-vllm for CUDA (scripts/setup-vllm.sh --cuda)" ./scripts/setup-vllm.sh --cuda
for py in .venv/bin/python .venv-vllm/bin/python; do
  if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: $py has torch $("$py" -c 'import torch; print(torch.__version__)') which sees no CUDA" \
         "device (a CPU-only build?); install a CUDA build of the same torch version there" >&2
    exit 2
  fi
done
PY=.venv/bin/python
CUDA_SETS=(--set policy.device=cuda --set policy.engine=vllm)
rm -rf runs/gpu-check
mkdir -p runs/gpu-check

# 3. the default config on CUDA
step "default config on CUDA (whole pipeline)" \
  "$PY" benchmarks/gpu_check.py run configs/default.yaml runs/gpu-check/default "${CUDA_SETS[@]}"

# 4. the learning config's first steps
if [ -f configs/learn-arith.yaml ]; then
  LEARN=(configs/learn-arith.yaml --quick)
  LEARN_LABEL="configs/learn-arith.yaml --quick, through train"
else
  echo "gpu_check: configs/learn-arith.yaml does not exist here; its place: the online k3-in-loss arm of" \
       "configs/p5-kl-small.yaml (--quick, 3 iterations)"
  LEARN=(configs/p5-kl-small.yaml --quick --set train.steps=3
         --set 'arms=[{name: k3-loss, train: {kl: {estimator: k3, placement: loss}}}]')
  LEARN_LABEL="configs/p5-kl-small.yaml online arm k3-loss, 3 iterations, through train"
fi
step "learning config's first steps on CUDA" \
  "$PY" benchmarks/gpu_check.py run "${LEARN[@]}" runs/gpu-check/learn --until train "${CUDA_SETS[@]}"

# 5. figures beside the CPU's
CPU_DEFAULT=${CPU_RUN_DEFAULT:-$("$PY" benchmarks/gpu_check.py cpu-dir configs/default.yaml)}
CPU_LEARN=${CPU_RUN_LEARN:-$("$PY" benchmarks/gpu_check.py cpu-dir "${LEARN[@]}")}
"$PY" benchmarks/gpu_check.py figures "configs/default.yaml, whole pipeline" runs/gpu-check/default "$CPU_DEFAULT"
"$PY" benchmarks/gpu_check.py figures "$LEARN_LABEL" runs/gpu-check/learn "$CPU_LEARN"
echo "gpu_check: done in $(( $(date +%s) - START )) s"
