#!/usr/bin/env bash
# A long, resumable `sparkonce verify` campaign on a lakehouse example: the embedded log into
# a Delta table (examples/delta_events.py) or into an Apache Iceberg table on a SQLite SQL
# catalog (examples/iceberg_events.py). Each call runs the trials not yet in the report; the
# report is kept in benchmarks/results/verify-FORMAT.json so a campaign can span sessions.
#
#   bash scripts/verify-campaign-lake.sh delta|iceberg [TRIALS] [VERIFY OPTIONS...]   (default 200)
#
# The two differ where their tables do:
# - delta: 6,000 records over 3 partitions, 500 per partition per batch (4 batches). Trials
#   run two at a time, each on its own Delta root given with --sink delta://
#   (SPARKONCE_CAMPAIGN_STORES changes the count).
# - iceberg: 4,500 records (3 batches of rows). One trial at a time by default, in the
#   example's own catalog and warehouse under the work directory (the report so far was run
#   so); SPARKONCE_CAMPAIGN_STORES=N runs N at a time, each in a SQLite catalog of its own
#   given with --sink iceberg+sqlite://. Each trial's final check reads the table with
#   PyIceberg and with DuckDB.
# The default fault kinds apply, less db-drop: neither table holds a connection across the
# commit (PyIceberg's SQL catalog opens one per call).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/campaign-lib.sh
FORMAT="${1:-}"
case "$FORMAT" in
  delta) RECORDS=6000 ;;
  iceberg) RECORDS=4500 ;;
  *) echo "usage: $0 delta|iceberg [TRIALS] [VERIFY OPTIONS...]" >&2; exit 2 ;;
esac
WORK="$PWD/.cache/verify-$FORMAT"
mkdir -p "$WORK"
if [ ! -f "$WORK/log/events.db" ]; then
  .venv/bin/sparkonce log create "$WORK/log" events --partitions 3
  seq 1 "$RECORDS" | awk '{print "k" ($1 % 7) "," $1}' |
    .venv/bin/sparkonce log produce "$WORK/log" events --separator ,
fi
SINKS=()
if [ "$FORMAT" = delta ]; then
  for i in $(seq 1 "${SPARKONCE_CAMPAIGN_STORES:-2}"); do SINKS+=(--sink "delta://$WORK/tables$i"); done
elif [ "${SPARKONCE_CAMPAIGN_STORES:-1}" -gt 1 ]; then
  for i in $(seq 1 "$SPARKONCE_CAMPAIGN_STORES"); do
    SINKS+=(--sink "iceberg+sqlite:///$WORK/catalogs/$i/catalog.db")
  done
fi
export EVENTS_DATA="$WORK"
resumable_campaign "verify-$FORMAT" "${2:-200}" "examples/${FORMAT}_events.py" "${SINKS[@]}" -- "${@:3}"
