#!/bin/bash
set -euo pipefail
cd /app
mkdir -p by_date
while IFS= read -r line; do
  printf '%s\n' "$line" >> "by_date/${line:0:10}.log"
done < events.log
for f in by_date/*.log; do
  printf '%s %s\n' "$(basename "$f" .log)" "$(wc -l < "$f" | tr -d ' ')"
done | sort > by_date/index.txt
