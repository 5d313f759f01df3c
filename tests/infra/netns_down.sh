#!/bin/bash
# netns_down.sh PREFIX N
P=${1:-pst}; N=${2:-3}
for i in $(seq 0 $N); do
  for pid in $(ip netns pids ${P}$i 2>/dev/null); do kill $pid 2>/dev/null; done   # only what runs in OUR namespaces
  ip netns del ${P}$i 2>/dev/null
done
ip netns del ${P}sw 2>/dev/null
# the safety route goes only with the last namespace (another test session may still use it)
[ -z "$(ip netns list 2>/dev/null)" ] && ip route del unreachable 10.77.0.0/16 metric 4000 2>/dev/null
true
