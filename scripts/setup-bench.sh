#!/usr/bin/env bash
# Build .venv-bench: the environment of the benchmarks that run TRL beside our trainer
# (benchmarks/train_step.py, benchmarks/learning.py). It is layered over .venv (a .pth file adds
# .venv's site-packages, so torch, transformers and peft are the very same builds) and adds only
# TRL and datasets, pinned in benchmarks/requirements-trl.txt, installed without dependencies so
# that nothing in .venv is replaced. Needs ./scripts/bootstrap.sh first.
# Idempotent: a stamp file records what was installed; a second run with nothing changed exits at once.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${HARNESSRL_BENCH_VENV:-.venv-bench}
[ -x .venv/bin/python ] || { echo "setup-bench: .venv is missing: run ./scripts/bootstrap.sh first" >&2; exit 1; }
stamp=$VENV/.harnessrl-setup-bench
want=$(cat benchmarks/requirements-trl.txt scripts/setup-bench.sh .venv/.harnessrl-bootstrap 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
start=$(date +%s)
echo "setup-bench: creating $VENV over .venv"
[ -x "$VENV/bin/python" ] || .venv/bin/python -m venv "$VENV"
main_site=$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')
bench_site=$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
echo "import site; site.addsitedir('$main_site')" > "$bench_site/harnessrl-main-venv.pth"
echo "setup-bench: installing $(grep -v '^#' benchmarks/requirements-trl.txt | tr '\n' ' ')(no dependencies)"
"$VENV/bin/python" -m pip install --quiet --no-deps -r benchmarks/requirements-trl.txt
"$VENV/bin/python" -c "import trl, datasets, torch, peft; print('setup-bench: trl', trl.__version__, 'datasets', datasets.__version__, 'over torch', torch.__version__)"
echo "$want" > "$stamp"
echo "setup-bench: done in $(( $(date +%s) - start )) s"
