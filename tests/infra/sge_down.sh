# sge_down.sh: source with SGE_TMP SGE_QMASTER_PID SGE_EXECD_PID set (from sge_up.sh)
qdel -f -u root >/dev/null 2>&1
kill -KILL "$SGE_EXECD_PID" "$SGE_QMASTER_PID" 2>/dev/null   # graceful 'kill' works too but takes ~10 s
rm -rf "$SGE_TMP"
