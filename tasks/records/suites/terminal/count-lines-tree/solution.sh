#!/bin/bash
set -euo pipefail
cd /app
py=$(find . -type f -name '*.py' -exec cat {} + | wc -l)
js=$(find . -type f -name '*.js' -exec cat {} + | wc -l)
printf 'py %d\njs %d\ntotal %d\n' "$py" "$js" "$((py + js))" > loc.txt
