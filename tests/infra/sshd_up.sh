# sshd_up.sh (testinfra.md §2): source it; sets SSHD_DIR SSHD_PORT SSHD_PID, $SSHD_DIR/bin/ssh, $SSHD_DIR/hosts
# source sshd_up.sh  -> SSHD_DIR SSHD_PORT SSHD_PID; $SSHD_DIR/bin/ssh wrapper; $SSHD_DIR/hosts (dmlc "host:port" hostfile)
# env knobs: SSHD_PORT (default: a free port), SSHD_ADDRS (default "127.0.0.1 127.0.0.2")
SSHD_ADDRS=${SSHD_ADDRS:-"127.0.0.1 127.0.0.2"}
SSHD_PORT=${SSHD_PORT:-$(${PYTHON:-python3} -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')}
SSHD_DIR=$(mktemp -d /tmp/sshd-fixture.XXXXXX)
ssh-keygen -q -t ed25519 -N '' -f "$SSHD_DIR/host_ed25519_key"
ssh-keygen -q -t ed25519 -N '' -f "$SSHD_DIR/id_ed25519"
cp "$SSHD_DIR/id_ed25519.pub" "$SSHD_DIR/authorized_keys"
{
  echo "Port $SSHD_PORT"
  for _a in $SSHD_ADDRS; do echo "ListenAddress $_a"; done
  cat <<CFG
HostKey $SSHD_DIR/host_ed25519_key
PidFile $SSHD_DIR/sshd.pid
AuthorizedKeysFile $SSHD_DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AcceptEnv DMLC_* PS_*
MaxStartups 100:30:200
MaxSessions 100
LogLevel ERROR
CFG
} > "$SSHD_DIR/sshd_config"
cat > "$SSHD_DIR/ssh_config" <<CFG
Host *
  IdentityFile $SSHD_DIR/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
  ConnectTimeout 5
  Port $SSHD_PORT
CFG
mkdir -p "$SSHD_DIR/bin" /run/sshd          # /run/sshd: privsep dir, sshd refuses to start without it
printf '#!/bin/sh\nexec /usr/bin/ssh -F %s "$@"\n' "$SSHD_DIR/ssh_config" > "$SSHD_DIR/bin/ssh"
chmod +x "$SSHD_DIR/bin/ssh"
for _a in $SSHD_ADDRS; do echo "$_a:$SSHD_PORT"; done > "$SSHD_DIR/hosts"
/usr/sbin/sshd -f "$SSHD_DIR/sshd_config" -E "$SSHD_DIR/sshd.log"   # daemonizes; pidfile written after listen()
for _i in $(seq 250); do [ -s "$SSHD_DIR/sshd.pid" ] && break; sleep 0.02; done
SSHD_PID=$(cat "$SSHD_DIR/sshd.pid")
