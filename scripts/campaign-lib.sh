# Sourced by the resumable campaign scripts (verify-campaign.sh, verify-campaign-lake.sh).
#
#   resumable_campaign NAME TRIALS PIPELINE_FILE [--sink URL ...] -- [VERIFY OPTIONS...]
#
# Runs the trials of `sparkonce verify PIPELINE_FILE` not yet in the report: the report is
# kept in benchmarks/results/NAME.json (and its recovery chart in NAME.png) so a campaign
# can span sessions; the working copy is in $WORK/out. Call it from the repository root
# with WORK set. The seed is SPARKONCE_CAMPAIGN_SEED (default 1). Returns verify's status.

# Test this checkout's code, whatever the venv's editable install points at (a campaign
# run from a worktree pinned at one commit keeps testing that commit while main moves).
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

resumable_campaign() {
  local name="$1" trials="$2" pipeline_file="$3"
  shift 3
  local sinks=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do sinks+=("$1"); shift; done
  [ $# -gt 0 ] && shift  # the "--"
  local result="benchmarks/results/$name.json" status=0
  mkdir -p "$WORK/out" benchmarks/results
  if [ -f "$result" ] && [ ! -f "$WORK/out/verify.json" ]; then
    cp "$result" "$WORK/out/verify.json"
  fi
  PYSPARK_PYTHON="$PWD/.venv/bin/python" .venv/bin/sparkonce verify "$pipeline_file" \
    --trials "$trials" --seed "${SPARKONCE_CAMPAIGN_SEED:-1}" --resume --out "$WORK/out" \
    "${sinks[@]}" "$@" || status=$?
  cp "$WORK/out/verify.json" "$result"
  if [ -f "$WORK/out/recovery.png" ]; then
    cp "$WORK/out/recovery.png" "benchmarks/results/$name.png"
  fi
  return $status
}
