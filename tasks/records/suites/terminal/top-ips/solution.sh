#!/bin/bash
set -euo pipefail
cd /app
cut -d' ' -f1 access.log | sort | uniq -c | sort -k1,1nr -k2,2 | head -n5 | sed -E 's/^ +//' > top_ips.txt
cut -d' ' -f9 access.log | grep -cx 404 > not_found_count.txt
