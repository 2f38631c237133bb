#!/bin/bash
set -euo pipefail
cd /app
sed -i \
  -e '/^\[server\]/,/^\[/{s/^port = .*/port = 8080/;s/^debug = .*/debug = false/;s/^#max_connections = .*/max_connections = 250/}' \
  -e '/^\[logging\]/,/^\[/{s/^level = .*/level = warning/}' config.ini
