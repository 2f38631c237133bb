#!/bin/bash
set -euo pipefail
cd /app
chmod 755 scripts/*.sh
chmod 644 scripts/README public/*
chmod 600 secrets/*.key
chmod 700 secrets
./scripts/deploy.sh > deploy.out
