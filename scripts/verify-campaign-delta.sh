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
# Test this checkout's code, whatever the venv's editable install points at (a campaign
# run from a worktree pinned at one commit keeps testing that commit while main moves).
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
TRIALS="${1:-200}"
SEED="${SPARKONCE_CAMPAIGN_SEED:-1}"
STORES="${SPARKONCE_CAMPAIGN_STORES:-2}"
WORK="$PWD/.cache/verify-delta"
RESULT=benchmarks/results/verify-delta.json
PY=.venv/bin/python
mkdir -p "$WORK/out" benchmarks/results
if [ ! -f "$WORK/log/events.db" ]; then
  # 6,000 records over 3 partitions, 500 per partition per batch: 4 batches.
  .venv/bin/sparkonce log create "$WORK/log" events --partitions 3
  seq 1 6000 | awk '{print "k" ($1 % 7) "," $1}' |
    .venv/bin/sparkonce log produce "$WORK/log" events --separator ,
fi
if [ -f "$RESULT" ] && [ ! -f "$WORK/out/verify.json" ]; then cp "$RESULT" "$WORK/out/verify.json"; fi
SINKS=()
for i in $(seq 1 "$STORES"); do SINKS+=(--sink "delta://$WORK/tables$i"); done
status=0
EVENTS_DATA="$WORK" PYSPARK_PYTHON="$PWD/$PY" .venv/bin/sparkonce verify examples/delta_events.py \
  --trials "$TRIALS" --seed "$SEED" --resume --out "$WORK/out" "${SINKS[@]}" "${@:2}" || status=$?
cp "$WORK/out/verify.json" "$RESULT"
[ -f "$WORK/out/recovery.png" ] && cp "$WORK/out/recovery.png" benchmarks/results/verify-delta.png
exit $status
