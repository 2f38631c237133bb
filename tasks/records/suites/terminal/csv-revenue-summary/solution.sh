#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
import csv
rev, units = {}, {}
with open("sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        r = row["region"]
        rev[r] = rev.get(r, 0) + int(row["qty"]) * float(row["unit_price"])
        units[r] = units.get(r, 0) + int(row["qty"])
with open("summary.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["region", "revenue", "units"])
    for r in sorted(rev):
        w.writerow([r, f"{rev[r]:.2f}", units[r]])
PY
