# source slurm_up.sh            -> single node (this machine, NodeAddr 127.0.0.1)
# SLURM_NETNS=pst SLURM_NNODES=3 source slurm_up.sh -> nodes n1..nN = slurmd inside namespaces pst1..N
#                                  (needs netns_up.sh first; controller on 10.77.0.1)
# exports SLURM_CONF; sets SLURM_DIR MUNGE_PID SLURMCTLD_PID
SLURM_DIR=$(mktemp -d /tmp/slurm-fixture.XXXXXX); chmod 755 "$SLURM_DIR"
mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/munge"; chmod 700 "$SLURM_DIR/munge"
dd if=/dev/urandom of="$SLURM_DIR/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$SLURM_DIR/munge/munge.key"
munged --force -S "$SLURM_DIR/munge/munge.sock" --key-file="$SLURM_DIR/munge/munge.key" \
  --log-file="$SLURM_DIR/munge/munged.log" --pid-file="$SLURM_DIR/munge/munged.pid" \
  --seed-file="$SLURM_DIR/munge/munged.seed"          # --force: allow running as root
MUNGE_PID=$(cat "$SLURM_DIR/munge/munged.pid")
H=$(hostname -s)
if [ -n "$SLURM_NETNS" ]; then
  CTL_ADDR=10.77.0.1; N=${SLURM_NNODES:-3}   # slurmctld must then run inside ${SLURM_NETNS}0 (nsenter --net)
  NODELINE="NodeName=n[1-$N] NodeAddr=10.77.0.[2-$((N+1))] CPUs=4 State=UNKNOWN"
else
  CTL_ADDR=127.0.0.1; N=1
  NODELINE="NodeName=$H NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN"
fi
cat > "$SLURM_DIR/slurm.conf" <<CFG
ClusterName=pstest
SlurmctldHost=$H($CTL_ADDR)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SLURM_DIR/munge/munge.sock
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool-%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd-%n.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=10
SlurmdTimeout=10
InactiveLimit=0
KillWait=2
MinJobAge=30
$NODELINE
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CFG
export SLURM_CONF="$SLURM_DIR/slurm.conf"
/usr/sbin/slurmctld -i -f "$SLURM_CONF"
if [ -n "$SLURM_NETNS" ]; then
  # nsenter --net, NOT 'ip netns exec': the latter remounts /sys and slurmd then dies on missing /sys/fs/cgroup
  for _i in $(seq 1 $N); do nsenter --net=/run/netns/$SLURM_NETNS$_i /usr/sbin/slurmd -N n$_i -f "$SLURM_CONF"; done
else
  /usr/sbin/slurmd -f "$SLURM_CONF"
fi
for _i in $(seq 300); do
  [ "$(sinfo -h -o '%t %D' 2>/dev/null)" = "idle $N" ] && break; sleep 0.1
done
SLURMCTLD_PID=$(cat "$SLURM_DIR/slurmctld.pid")
