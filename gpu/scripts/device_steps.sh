# The step runner of gpu/device_check.sh (sourced; tested by tests/gpu/device_scripts.sh and
# tests/gpu/device_check_dry.sh). Needs OUT.
#   step NAME LIMIT FILE CMD...   runs CMD under `timeout -k GRACE LIMIT`, its stdout and stderr
#     shown as they come (tee) and appended to FILE ("-": shown only); then one JSON line
#     {"step","rc","seconds","limit"} in $OUT/steps.jsonl and a line "== NAME: exit RC after S s".
#     Sets STEP_RC. A step killed by its limit keeps every line it printed (the binaries are
#     line-buffered); rc 124 (TERM) or 137 (KILL after the grace).
#   check NAME OK|FAIL WHY        records a verdict beyond the exit code (e.g. "no kernel ran")
#   FAILED counts the steps and checks that failed.
FAILED=${FAILED:-0}
QKMLA_KILL_GRACE=${QKMLA_KILL_GRACE:-3}

json_str() {  # a JSON string: backslashes, quotes and control characters escaped
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  printf '"%s"' "$(printf '%s' "$s" | tr '\n\t\r' '   ')"
}

step() {
  local name=$1 limit=$2 file=$3
  shift 3
  local t0=$SECONDS
  echo "== $name (limit $limit s): $*"
  if [ "$file" = - ]; then
    timeout -k "$QKMLA_KILL_GRACE" "$limit" "$@" 2>&1
    STEP_RC=$?
  else
    timeout -k "$QKMLA_KILL_GRACE" "$limit" "$@" 2>&1 | tee -a "$file"
    STEP_RC=${PIPESTATUS[0]}
  fi
  local s=$((SECONDS - t0))
  printf '{"step":%s,"rc":%d,"seconds":%d,"limit":%d}\n' "$(json_str "$name")" "$STEP_RC" "$s" \
    "$limit" >> "$OUT/steps.jsonl"
  echo "== $name: exit $STEP_RC after $s s"
  [ "$STEP_RC" -eq 0 ] || FAILED=$((FAILED + 1))
  return 0
}

check() {
  local name=$1 verdict=$2 why=$3
  printf '{"check":%s,"ok":%s,"why":%s}\n' "$(json_str "$name")" \
    "$([ "$verdict" = OK ] && echo true || echo false)" "$(json_str "$why")" >> "$OUT/steps.jsonl"
  echo "== check $name: $verdict ($why)"
  [ "$verdict" = OK ] || FAILED=$((FAILED + 1))
}
