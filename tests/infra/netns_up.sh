#!/bin/bash
# netns_up.sh PREFIX N : namespaces PREFIXsw (bridge br0) + PREFIX1..N (eth0 = 10.77.0.<i+1>/24)
# + PREFIX0 (10.77.0.1), the launcher's host. Root only (CAP_NET_ADMIN + CAP_SYS_ADMIN).
set -e
P=${1:-pst}; N=${2:-3}
# safety net: without it 10.77.x from the root ns would follow the default route OUT of the machine
ip route replace unreachable 10.77.0.0/16 metric 4000
ip netns add ${P}sw
ip -n ${P}sw link set lo up
ip -n ${P}sw link add br0 type bridge
ip -n ${P}sw link set br0 up
for i in $(seq 1 $N); do
  ip netns add ${P}$i
  ip link add eth0 netns ${P}$i type veth peer name p$i netns ${P}sw
  ip -n ${P}sw link set p$i master br0 up
  ip -n ${P}$i addr add 10.77.0.$((i+1))/24 dev eth0
  ip -n ${P}$i link set eth0 up
  ip -n ${P}$i link set lo up
done
# the launcher host is a namespace too (10.77.0.1): the root namespace never addresses 10.77.x
ip netns add ${P}0
ip link add eth0 netns ${P}0 type veth peer name p0 netns ${P}sw
ip -n ${P}sw link set p0 master br0 up
ip -n ${P}0 addr add 10.77.0.1/24 dev eth0
ip -n ${P}0 link set eth0 up
ip -n ${P}0 link set lo up
