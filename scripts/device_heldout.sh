#!/usr/bin/env bash
# scripts/heldout_shapes.py on the GPU machine's 16 CPU cores (no GPU needed):
# every shape at 1,000 commits, then the short histories with the culprit at
# either end. Tables go to $OUT.
. scripts/device_env.sh > /dev/null 2>&1
H="python scripts/heldout_shapes.py --jobs 16"
$H --trials 200 > $OUT/shapes1000.txt 2>&1
$H --shapes ln60,seed --commits 10 --culprit last --trials 600 > $OUT/short_last.txt 2>&1
$H --shapes ln60,seed --commits 10 --culprit first --trials 600 > $OUT/short_first.txt 2>&1
$H --shapes ln60,drift50 --commits 30 --trials 600 > $OUT/n30.txt 2>&1
cat $OUT/*.txt
