#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
import json
out = {}
for line in open("app.env"):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    if line.startswith("export "):
        line = line[len("export "):]
    key, _, val = line.partition("=")
    key, val = key.strip(), val.strip()
    if len(val) >= 2 and val[0] == val[-1] and val[0] in "'\"":
        val = val[1:-1]
    else:
        val = val.split(" #", 1)[0].strip()
    out[key] = val
json.dump(out, open("env.json", "w"), indent=2)
PY
