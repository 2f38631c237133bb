#!/bin/bash
set -euo pipefail
cd /app
cat contacts/*.txt | grep -oiE '[a-z0-9._+-]+@[a-z0-9-]+(\.[a-z0-9-]+)+' | tr 'A-Z' 'a-z' | sort -u > emails.txt
wc -l < emails.txt | tr -d ' ' > email_count.txt
