#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
src = open("stats.py").read()
src = src.replace("return [int(line) for line in f]", "return [float(line) if '.' in line else int(line) for line in f if line.strip()]")
src = src.replace("return sum(xs) // len(xs)", "return sum(xs) / len(xs)")
src = src.replace("    return xs[len(xs) // 2]\n", "    n = len(xs)\n    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2\n")
open("stats.py", "w").write(src)
PY
python3 stats.py numbers.txt > numbers.out
