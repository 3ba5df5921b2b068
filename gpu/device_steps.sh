# step NAME SECONDS COMMAND...: runs COMMAND with a time limit and appends "NAME: exit RC after S s"
# to $OUT/steps.txt, whatever the command did (sourced by gpu/device_check.sh; tested by
# tests/gpu/device_scripts.sh). The command's own output goes where the caller redirects it.
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS rc=0
  timeout "$limit" "$@" || rc=$?
  echo "$name: exit $rc after $((SECONDS - t0)) s" >> "$OUT/steps.txt"
}
