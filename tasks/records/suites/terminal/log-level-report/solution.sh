#!/bin/bash
set -euo pipefail
cd /app
grep -v '^[[:space:]]*$' logs/app.log | cut -d' ' -f2 | sort | uniq -c | sort -k1,1nr -k2,2 \
  | sed -E 's/^ *([0-9]+) (.*)$/\2 \1/' > report.txt
grep -E '^[^ ]+ ERROR ' logs/app.log | cut -d' ' -f3 | tr -d ':' | sort | uniq -c | sort -k1,1nr -k2,2 \
  | head -n1 | sed -E 's/^ *[0-9]+ //' > top_error_component.txt
