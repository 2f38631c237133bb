#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
import csv
from collections import Counter
depts = {r["dept_id"]: r["dept_name"] for r in csv.DictReader(open("departments.csv", newline=""))}
rows = sorted((r["name"], depts.get(r["dept_id"], "UNKNOWN")) for r in csv.DictReader(open("employees.csv", newline="")))
with open("joined.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["name", "dept_name"])
    w.writerows(rows)
with open("dept_sizes.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["dept_name", "employees"])
    w.writerows(sorted(Counter(d for _, d in rows).items()))
PY
