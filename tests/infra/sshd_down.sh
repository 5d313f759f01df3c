kill "$SSHD_PID" 2>/dev/null; rm -rf "$SSHD_DIR"
