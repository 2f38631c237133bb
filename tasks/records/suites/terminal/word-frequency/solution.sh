#!/bin/bash
set -euo pipefail
cd /app
grep -oE '[A-Za-z]+' book.txt | tr 'A-Z' 'a-z' | grep -vxF -f stopwords.txt | sort | uniq -c \
  | sort -k1,1nr -k2,2 | head -n10 | sed -E 's/^ *([0-9]+) (.*)$/\2 \1/' > top_words.txt
