#!/bin/bash
set -euo pipefail
cd /app
for f in docs/*.txt; do
  sed -i -e 's/\r$//' -e 's/[ \t]*$//' "$f"
  [ -n "$(tail -c1 "$f")" ] && echo >> "$f"
done
true
