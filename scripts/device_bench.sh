#!/usr/bin/env bash
# The benchmark tables of docs/benchmarks.rst on the GPU machine's 16 CPU cores
# (no GPU needed; git-bayesect is not installed there, so its rows are left
# out). Logs and tables go to $OUT.
. scripts/device_env.sh > /dev/null 2>&1
S=plain,maj5,klbisect,known
B="python scripts/bench_bisect.py --jobs 16"
$B --strategies $S --write-docs $OUT/main.txt > $OUT/main.log 2>&1
$B --heldout --trials 100 --commits 1000 --strategies $S --write-docs $OUT/heldout.txt > $OUT/heldout.log 2>&1
$B --set variants --commits 1000 --trials 150 --strategies $S --write-docs $OUT/var.txt > $OUT/var.log 2>&1
for sd in 11 12 13; do $B --commits 1000 --strategies klbisect --seed $sd --trials 100 --wrong --model "name=bimodal good=0.003,0.006 bad=0.007,0.013 labels=1 outliers=0.15 outlier-mult=2.5,3.5" > $OUT/bimodal$sd.log 2>&1; done
for sd in 1 2 3; do $B --commits 1000 --strategies klbisect --seed $sd --trials 150 --wrong --model "name=out10 good=0.003,0.006 bad=0.0065,0.012 labels=3 outliers=0.10 outlier-mult=1.5,3" > $OUT/out10_$sd.log 2>&1; done
grep -h 'klbisect' $OUT/*.log | grep -v command | head -60
