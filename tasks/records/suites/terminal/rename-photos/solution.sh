#!/bin/bash
set -euo pipefail
cd /app
cd photos
for f in IMG_*_*.jpg; do
  d=${f#IMG_}; d=${d%%_*}
  n=${f##*_}; n=${n%.jpg}
  mv -- "$f" "$(printf '%s-%s-%s_%03d.jpg' "${d:0:4}" "${d:4:2}" "${d:6:2}" "$n")"
done
