qdel -f -u root >/dev/null 2>&1
kill -KILL "$SGE_EXECD_PID" "$SGE_QMASTER_PID" 2>/dev/null   # graceful 'kill' works too but takes ~10 s
rm -rf "$SGE_TMP"
