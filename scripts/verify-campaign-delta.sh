#!/usr/bin/env bash
# A long, resumable `sparkonce verify` campaign on examples/delta_events.py (embedded log
# -> a Delta table). Each call runs the trials not yet in the report; the report is kept
# in benchmarks/results/verify-delta.json so a campaign can span sessions. Trials run two
# at a time, each on its own Delta root (SPARKONCE_CAMPAIGN_STORES changes the count).
# The default fault kinds apply, less db-drop: a Delta table has no connection to drop.
#
#   bash scripts/verify-campaign-delta.sh [TRIALS] [VERIFY OPTIONS...]   (default 200)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/campaign-lib.sh
WORK="$PWD/.cache/verify-delta"
STORES="${SPARKONCE_CAMPAIGN_STORES:-2}"
mkdir -p "$WORK"
if [ ! -f "$WORK/log/events.db" ]; then
  # 6,000 records over 3 partitions, 500 per partition per batch: 4 batches.
  .venv/bin/sparkonce log create "$WORK/log" events --partitions 3
  seq 1 6000 | awk '{print "k" ($1 % 7) "," $1}' |
    .venv/bin/sparkonce log produce "$WORK/log" events --separator ,
fi
SINKS=()
for i in $(seq 1 "$STORES"); do SINKS+=(--sink "delta://$WORK/tables$i"); done
export EVENTS_DATA="$WORK"
resumable_campaign verify-delta "${1:-200}" examples/delta_events.py "${SINKS[@]}" -- "${@:2}"
