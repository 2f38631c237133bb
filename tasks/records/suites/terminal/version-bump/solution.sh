#!/bin/bash
set -euo pipefail
cd /app
old=$(cat VERSION)
IFS=. read -r major minor patch <<< "$old"
new="$major.$((minor + 1)).0"
echo "$new" > VERSION
sed -i "s/^version = .*/version = $new/" setup.cfg
{ echo "# Changelog"; echo; echo "## $new"; sed 's/^/- /' pending.txt; echo; tail -n +3 CHANGELOG.md; } > CHANGELOG.new
mv CHANGELOG.new CHANGELOG.md
: > pending.txt
