#!/bin/bash
set -euo pipefail
cd /app
cd release
find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | while IFS= read -r f; do sha256sum -- "$f"; done > /tmp/SHA256SUMS.tmp
mv /tmp/SHA256SUMS.tmp SHA256SUMS
echo $(( $(find . -type f ! -name SHA256SUMS -printf '%s+')0 )) > ../release_size.txt
