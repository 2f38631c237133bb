#!/bin/bash
set -euo pipefail
cd /app
cd data
find . -type f -exec sha256sum {} + | sed 's#  \./#  #' | sort -k1,1 -k2,2 > /tmp/sums
python3 - <<'PY' > ../duplicates.txt
groups = {}
for line in open("/tmp/sums"):
    h, p = line.rstrip("\n").split("  ", 1)
    groups.setdefault(h, []).append(p)
print("\n".join(sorted(" ".join(sorted(g)) for g in groups.values() if len(g) > 1)))
PY
while read -r first rest; do
  for p in $rest; do rm -f -- "$p"; done
done < ../duplicates.txt
