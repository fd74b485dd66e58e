#!/usr/bin/env bash
# Whole nightly histories through the real command (scripts/nightly_days.py),
# one history per CPU core of the GPU machine: 16 with a regression (x1.6 on
# one label of three before night 6), 16 with none. Logs go to $OUT.
. scripts/device_env.sh > /dev/null 2>&1
N=${N:-16}; NIGHTS=${NIGHTS:-16}
for i in $(seq 0 $((N - 1))); do
    python scripts/nightly_days.py --histories 1 --nights $NIGHTS --seed $((100 + i)) > $OUT/reg$i.log 2>&1 &
    python scripts/nightly_days.py --histories 1 --nights $NIGHTS --regress-night 99 --seed $((300 + i)) > $OUT/null$i.log 2>&1 &
done
wait
for kind in reg null; do
    echo "== $kind"
    for i in $(seq 0 $((N - 1))); do grep -E '^ +0 ' $OUT/$kind$i.log | sed "s/^ *0 /seed $i /"; done
done
