# ns_sshd_up.sh (testinfra.md §3)
# source after sshd_up.sh and netns_up.sh: one sshd per namespace on 10.77.0.<i+1>:22, same keys
# usage: NS_PREFIX=pst NS_N=3 source ns_sshd_up.sh  -> $SSHD_DIR/hosts_ns (dmlc hostfile, explicit :22)
: > "$SSHD_DIR/hosts_ns"
for _i in $(seq 1 ${NS_N:-3}); do
  sed -e "s/^Port .*/Port 22/" -e "/^ListenAddress/d" -e "s#^PidFile .*#PidFile $SSHD_DIR/sshd-ns$_i.pid#" \
      "$SSHD_DIR/sshd_config" > "$SSHD_DIR/sshd_config.ns$_i"
  echo "ListenAddress 10.77.0.$((_i+1))" >> "$SSHD_DIR/sshd_config.ns$_i"
  ip netns exec ${NS_PREFIX:-pst}$_i /usr/sbin/sshd -f "$SSHD_DIR/sshd_config.ns$_i" -E "$SSHD_DIR/sshd-ns$_i.log"
  echo "10.77.0.$((_i+1)):22" >> "$SSHD_DIR/hosts_ns"
done
for _i in $(seq 1 ${NS_N:-3}); do for _t in $(seq 250); do [ -s "$SSHD_DIR/sshd-ns$_i.pid" ] && break; sleep 0.02; done; done
