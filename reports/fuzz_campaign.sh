#!/usr/bin/env bash
# The fuzz campaign of README "Hardening": every libFuzzer target (ASan + UBSan) for SECONDS each on
# two workers (-fork=2), from the committed seed corpora plus the build's corpus, stopping at the
# first crash, leak, timeout or UB report. Writes reports/fuzz-campaign.md with inputs, time,
# coverage and crashes per target; exits 1 on any finding (the reproducer is left in the work folder).
# Usage: SECONDS_PER_TARGET=900 [TARGETS="fuzz_text"] bash reports/fuzz_campaign.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
secs=${SECONDS_PER_TARGET:-900}
work=$(mktemp -d)
echo "work folder: $work"
out=reports/fuzz-campaign.md
{
  echo "# Fuzz campaign"
  echo
  echo "Made by \`SECONDS_PER_TARGET=$secs bash reports/fuzz_campaign.sh\` at commit $(git describe --always --dirty --abbrev=12), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(clang++ --version | head -1)."
  echo "Each target: libFuzzer -fork=2 -rss_limit_mb=2048 -timeout=30, ASan + UBSan (every report fatal), -DNDEBUG as shipped."
  echo
  echo "| target | input paths | seconds | inputs run | coverage (edges) | features | corpus | crashes / leaks / timeouts / UB |"
  echo "|---|---|---:|---:|---:|---:|---:|---|"
} > "$out.tmp"
status=0
for target in ${TARGETS:-fuzz_readers fuzz_text}; do
  case $target in
    fuzz_readers) what="safetensors, .npy, case config metadata, golden --inputs";;
    fuzz_text) what="budget TOML, gate TOML, config JSON, case flags";;
  esac
  corpus="$build/tests/fuzz_corpus/$target"
  mkdir -p "$corpus"
  log="$work/$target.log"
  rc=0
  (cd "$work" && "$OLDPWD/$build/tests/$target" -fork=2 -max_total_time="$secs" -rss_limit_mb=2048 \
     -timeout=30 "$OLDPWD/$corpus" "$OLDPWD/tests/fuzz/corpus/$target") > "$log" 2>&1 || rc=$?
  # The last progress line of fork mode: "#N: cov: C ft: F corp: K exec/s: E oom/timeout/crash: a/b/c time: Ts ..."
  last=$(grep -E '^#[0-9]+: cov:' "$log" | tail -n 1 || true)
  n=$(sed -E 's/^#([0-9]+):.*/\1/' <<<"$last")
  cov=$(sed -E 's/.* cov: ([0-9]+) .*/\1/' <<<"$last")
  ft=$(sed -E 's/.* ft: ([0-9]+) .*/\1/' <<<"$last")
  corp=$(sed -E 's/.* corp: ([0-9]+) .*/\1/' <<<"$last")
  oct=$(sed -E 's/.* oom\/timeout\/crash: ([0-9\/]+) .*/\1/' <<<"$last")
  t=$(sed -E 's/.* time: ([0-9]+)s.*/\1/' <<<"$last")
  findings="none"
  if [ "$rc" != 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error' "$log"; then
    findings="FOUND (exit $rc; oom/timeout/crash $oct; see $log)"
    status=1
  fi
  echo "| $target | $what | $t | $n | $cov | $ft | $corp | $findings |" >> "$out.tmp"
  echo "$target: $n inputs in ${t}s, cov $cov, $findings"
done
mv "$out.tmp" "$out"
exit $status
