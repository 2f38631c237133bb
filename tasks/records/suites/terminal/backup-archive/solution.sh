#!/bin/bash
set -euo pipefail
cd /app
tar --exclude='*.tmp' -czf backup.tar.gz project
tar -tzf backup.tar.gz | grep -v '/$' | sort > backup.list
