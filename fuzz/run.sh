#!/usr/bin/env bash
# Runs each fuzz target for SECONDS from its committed seeds (fuzz/corpus/TARGET) and what
# earlier runs found (target/fuzz/corpus/TARGET, where libFuzzer writes new inputs, so the
# committed seeds never change), then prints per target the executions run and whether it
# found anything. Exits non-zero if any target crashed or hung. Targets run one per core at
# once (FUZZ_JOBS, default nproc): each libFuzzer process is single-threaded.
# Usage: fuzz/run.sh SECONDS BIN_DIR TARGET...
set -uo pipefail
seconds=$1 bin=$2
shift 2
cd "$(dirname "$0")/.."
jobs=${FUZZ_JOBS:-$(nproc)}
mkdir -p target/fuzz/logs

# Runs target $1, leaving libFuzzer's exit status in its .status file.
fuzz() {
    local t=$1 work=target/fuzz/corpus/$1 artifacts=target/fuzz/artifacts/$1/
    mkdir -p "$work" "$artifacts"
    local dict=()
    [[ -f fuzz/dict/$t.dict ]] && dict=(-dict="fuzz/dict/$t.dict")
    # -timeout: an input that takes seconds is a finding too (every target is linear).
    "$bin/$t" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$artifacts" "${dict[@]}" "$work" "fuzz/corpus/$t" \
        >"target/fuzz/logs/$t.log" 2>&1
    echo $? >"target/fuzz/logs/$t.status"
}

for t in "$@"; do
    rm -f "target/fuzz/logs/$t.status"
    while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
    fuzz "$t" &
done
wait

found=0
printf '%-14s %11s  %s\n' target executions result
for t in "$@"; do
    log=target/fuzz/logs/$t.log status=$(cat "target/fuzz/logs/$t.status" 2>/dev/null || echo lost)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    if [[ $status == 0 ]]; then
        printf '%-14s %11s  %s\n' "$t" "${runs:-?}" "nothing found"
    else
        found=1
        printf '%-14s %11s  %s\n' "$t" "${runs:-?}" "FOUND SOMETHING (exit $status), log: $log"
        grep -E -A3 "panicked at|ERROR: libFuzzer|Test unit written" "$log" | sed 's/^/    /'
    fi
done
exit $found
