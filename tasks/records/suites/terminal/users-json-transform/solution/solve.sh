#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
import json
from collections import Counter
users = json.load(open("users.json"))
json.dump({u["email"]: u["name"] for u in users if u["active"]}, open("active_users.json", "w"), indent=2)
json.dump(dict(Counter(r for u in users for r in u["roles"])), open("role_counts.json", "w"), indent=2)
PY
