#!/bin/bash
set -euo pipefail
cd /app
cd deploy
grep -rlF --include='*.conf' --include='*.yaml' 'old-api.example.com' . | sed 's#^\./##' | sort > ../changed.txt
while read -r f; do sed -i 's/old-api\.example\.com/api.example.com/g' "$f"; done < ../changed.txt
