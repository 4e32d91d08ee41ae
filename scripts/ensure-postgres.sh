#!/usr/bin/env bash
# Make sure PostgreSQL server binaries (initdb, pg_ctl, postgres) are installed.
# The tests start their own throwaway cluster on 127.0.0.1; nothing is started here.
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  exit 0
fi
echo "PostgreSQL server not found; installing it from Debian's packages" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
ls /usr/lib/postgresql/*/bin/initdb >/dev/null
