# sshd_down.sh: source with SSHD_PID SSHD_DIR set (from sshd_up.sh)
kill "$SSHD_PID" 2>/dev/null; rm -rf "$SSHD_DIR"
