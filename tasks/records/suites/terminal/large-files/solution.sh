#!/bin/bash
set -euo pipefail
cd /app
cd storage
find . -type f -size +1000c -printf '%s %P\n' | sort -k1,1nr -k2,2 > ../large_files.txt
while read -r size path; do
  mkdir -p "../archive/$(dirname "$path")"
  mv -- "$path" "../archive/$path"
done < ../large_files.txt
