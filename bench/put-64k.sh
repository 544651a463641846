#!/usr/bin/env bash
# Latency of a CLI `put` of a 64 KiB file (issue 19's small-put target), with process start
# measured apart: on a fresh local cluster of its own (5 servers, never the one
# TESSERA_CLUSTER names), N timed `put`s (RAID-5) and N timed commands that start and fail at
# once (a put of a missing local file: process start, argument parsing, no network).
# "work" = put median - start+fail median. Prints one line per round; every put is read back.
#
# Usage: bench/put-64k.sh BIN [ROUNDS] [N]      e.g. bench/put-64k.sh target/release/tessera 3 20
set -euo pipefail
bin=$(realpath "${1:?usage: put-64k.sh TESSERA_BINARY [ROUNDS] [N]}")
rounds=${2:-1}
n=${3:-20}
name=$(basename "$bin")
dir=$(mktemp -d /tmp/put-64k.XXXXXX)
unset TESSERA_CLUSTER TESSERA_KEY
cleanup() { "$bin" down --dir "$dir/cluster" >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
"$bin" up --detach --dir "$dir/cluster" >/dev/null
cluster="$dir/cluster/cluster.toml"
head -c 65536 /dev/urandom > "$dir/64k.bin"
median() { sort -n | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : int((v[NR/2]+v[NR/2+1])/2)}'; }
now_us() { echo $(( $(date +%s%N) / 1000 )); }
# One put first: the cluster's first connections and files are not what is measured.
"$bin" put "$dir/64k.bin" warm --scheme raid5 --cluster "$cluster" >/dev/null
for r in $(seq 1 "$rounds"); do
  puts=(); fails=()
  for i in $(seq 1 "$n"); do
    t0=$(now_us)
    "$bin" put "$dir/64k.bin" "r$r/f$i" --scheme raid5 --cluster "$cluster" >/dev/null
    puts+=($(( $(now_us) - t0 )))
    t0=$(now_us)
    if "$bin" put "$dir/missing.bin" x --cluster "$cluster" >/dev/null 2>&1; then
      echo "put-64k: a put of a missing file succeeded" >&2; exit 1
    fi
    fails+=($(( $(now_us) - t0 )))
  done
  put_med=$(printf '%s\n' "${puts[@]}" | median)
  fail_med=$(printf '%s\n' "${fails[@]}" | median)
  echo "$name round $r: put median $put_med us, start+fail median $fail_med us, work $((put_med - fail_med)) us"
  for i in $(seq 1 "$n"); do
    "$bin" get "r$r/f$i" "$dir/back.bin" --cluster "$cluster" >/dev/null
    cmp -s "$dir/64k.bin" "$dir/back.bin" || { echo "put-64k: r$r/f$i read back differs" >&2; exit 1; }
  done
  echo "read back ok"
done
