#!/usr/bin/env bash
# A long, resumable `sparkonce verify` campaign on examples/iceberg_events.py (embedded log
# -> an Apache Iceberg table on a SQLite SQL catalog). Each call runs the trials not yet in
# the report; the report is kept in benchmarks/results/verify-iceberg.json so a campaign can
# span sessions. One trial at a time, in the example's own catalog and warehouse under
# the work directory (an IcebergSink is given its catalog in the pipeline file: no --sink
# URL moves it). db-drop does not apply: PyIceberg's SQL catalog holds no connection across
# the commit. Each trial's final check reads the table with PyIceberg and with DuckDB.
#
#   bash scripts/verify-campaign-iceberg.sh [TRIALS] [VERIFY OPTIONS...]   (default 200)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/campaign-lib.sh
WORK="$PWD/.cache/verify-iceberg"
mkdir -p "$WORK"
if [ ! -f "$WORK/log/events.db" ]; then
  # 4,500 records over 3 partitions, 500 per partition per batch: 3 batches.
  .venv/bin/sparkonce log create "$WORK/log" events --partitions 3
  seq 1 4500 | awk '{print "k" ($1 % 7) "," $1}' |
    .venv/bin/sparkonce log produce "$WORK/log" events --separator ,
fi
export EVENTS_DATA="$WORK"
resumable_campaign verify-iceberg "${1:-200}" examples/iceberg_events.py -- "${@:2}"
