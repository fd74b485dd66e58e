#!/usr/bin/env bash
# Whole nightly histories through the real command (scripts/nightly_days.py),
# one history per process on the GPU machine's CPU cores: N with a regression
# (one label of three times FACTOR before night 6) and N with none. With
# BEFORE=dir (a klbisect tree, e.g. `git archive REV klbisect | tar -x -C dir`)
# the regression histories run again under that tree. Logs go to $OUT.
. scripts/device_env.sh > /dev/null 2>&1
N=${N:-16}; NIGHTS=${NIGHTS:-16}; FACTOR=${FACTOR:-1.6}; NULL=${NULL:-1}
for i in $(seq 0 $((N - 1))); do
    python scripts/nightly_days.py --histories 1 --nights $NIGHTS --factor $FACTOR --seed $((100 + i)) \
        > $OUT/reg$i.log 2>&1 &
    [ "$NULL" = 1 ] && python scripts/nightly_days.py --histories 1 --nights $NIGHTS --regress-night 99 \
        --seed $((300 + i)) > $OUT/null$i.log 2>&1 &
    [ -n "$BEFORE" ] && PYTHONPATH=$PWD/$BEFORE:$PYTHONPATH python scripts/nightly_days.py --histories 1 \
        --nights $NIGHTS --factor $FACTOR --seed $((100 + i)) > $OUT/before$i.log 2>&1 &
done
wait
for kind in reg null before; do
    ls $OUT/${kind}0.log > /dev/null 2>&1 || continue
    echo "== $kind"
    for i in $(seq 0 $((N - 1))); do grep -E '^ +0 ' $OUT/$kind$i.log | sed "s/^ *0 /seed $i /"; done
done
