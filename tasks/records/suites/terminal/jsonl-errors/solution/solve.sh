#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
import json
recs = [json.loads(l) for l in open("requests.jsonl") if l.strip()]
errs = sorted(({"ts": r["ts"], "path": r["path"], "status": r["status"]} for r in recs if r["status"] >= 500),
              key=lambda r: (r["ts"], r["path"], r["status"]))
with open("errors.jsonl", "w") as f:
    f.writelines(json.dumps(e) + "\n" for e in errs)
with open("slow_paths.txt", "w") as f:
    f.writelines(p + "\n" for p in sorted({r["path"] for r in recs if r["ms"] > 500}))
PY
