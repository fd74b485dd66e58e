#!/usr/bin/env bash
# Whole nightly histories through the real command (scripts/nightly_days.py),
# one history per process on the GPU machine's CPU cores, N of each set in
# SETS (default "reg null"):
#   reg     one label of three times FACTOR before night REG_NIGHT (6)
#   null    no change at all
#   env     no code change; the machine changes before night ENV_NIGHT (6):
#           every value times ENV_FACTOR (1.6)
#   envreg  the machine changes before night ENV_NIGHT, and the regression
#           lands before night REG_NIGHT
# With BEFORE=dir (a klbisect tree, e.g. `git archive REV klbisect | tar -x
# -C dir`) the sets in BEFORE_SETS (default: reg) run again under that tree.
# Logs go to $OUT; the summary names each history by its set and index.
. scripts/device_env.sh > /dev/null 2>&1
N=${N:-16}; NIGHTS=${NIGHTS:-16}; FACTOR=${FACTOR:-1.6}; SETS=${SETS:-reg null}
REG_NIGHT=${REG_NIGHT:-6}; ENV_NIGHT=${ENV_NIGHT:-6}; ENV_FACTOR=${ENV_FACTOR:-1.6}; BEFORE_SETS=${BEFORE_SETS:-reg}
args_for() {
    local env="--env-night $ENV_NIGHT --env-factor $ENV_FACTOR"
    case $1 in
        reg) echo "--factor $FACTOR --regress-night $REG_NIGHT" ;;
        null) echo "--regress-night 99" ;;
        env) echo "--regress-night 99 $env" ;;
        envreg) echo "--factor $FACTOR --regress-night $REG_NIGHT $env" ;;
    esac
}
runs=""
for set in $SETS; do
    runs="$runs $set"
    case " $BEFORE_SETS " in *" $set "*) [ -n "$BEFORE" ] && runs="$runs before-$set" ;; esac
done
for run in $runs; do
    set=${run#before-}
    for i in $(seq 0 $((N - 1))); do
        if [ "$run" = "$set" ]; then
            python scripts/nightly_days.py --histories 1 --nights $NIGHTS --seed $((100 + i)) $(args_for $set) \
                > $OUT/$run$i.log 2>&1 &
        else
            PYTHONPATH=$PWD/$BEFORE:$PYTHONPATH python scripts/nightly_days.py --histories 1 --nights $NIGHTS \
                --seed $((100 + i)) $(args_for $set) > $OUT/$run$i.log 2>&1 &
        fi
    done
done
wait
for run in $runs; do
    echo "== $run: $(sed -n 1p $OUT/${run}0.log)"
    for i in $(seq 0 $((N - 1))); do grep -E '^ +0 ' $OUT/$run$i.log | sed "s/^ *0 /$run $i /"; done
done
