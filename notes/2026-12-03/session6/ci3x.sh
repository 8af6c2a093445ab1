#!/bin/bash
# Three clean-clone CI runs in a row, pinned to one commit; stops at the first failure.
C=$1; L=/work/s6/ci/ci3x.log
echo "row at $C start $(date -u)" >> $L
for i in 1 2 3; do
  d=/work/cirun$i; rm -rf $d; git clone -q /work/main $d && cd $d && git checkout -q $C || exit 9
  s=$(date +%s); bash .ci/run > /work/s6/ci/run$i.log 2>&1; rc=$?
  echo "run $i rc=$rc $(( $(date +%s)-s ))s end $(date -u)" >> $L
  grep -E "passed|failed" /work/s6/ci/run$i.log | tail -2 >> $L
  cd /work; rm -rf $d
  [ $rc -ne 0 ] && break
done
echo "row done $(date -u)" >> $L
