# sge_up.sh (testinfra.md §5): source after sge_install.sh; starts qmaster + execd on this host
# -> SGE_TMP SGE_QMASTER_PID SGE_EXECD_PID (one cell per machine: never run two at once)
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
H=$(hostname)
SGE_TMP=$(mktemp -d /tmp/sge-fixture.XXXXXX)
# hostname resolves to 127.0.0.1 whose first name in /etc/hosts is 'localhost': tell SGE they are the same host
echo "$H localhost" > $SGE_ROOT/$SGE_CELL/common/host_aliases
/usr/sbin/sge_qmaster
for _i in $(seq 100); do qconf -sh >/dev/null 2>&1 && break; sleep 0.1; done
# allow root jobs (min_uid/min_gid 1000 by default) -- must be done BEFORE execd starts
qconf -sconf global | sed -e 's/^min_uid .*/min_uid 0/' -e 's/^min_gid .*/min_gid 0/' > $SGE_TMP/global
qconf -Mconf $SGE_TMP/global >/dev/null          # file name must be the config name ('global')
qconf -ssconf | sed -e 's/^schedule_interval .*/schedule_interval 0:0:1/' \
  -e 's/^flush_submit_sec .*/flush_submit_sec 1/' -e 's/^flush_finish_sec .*/flush_finish_sec 1/' > $SGE_TMP/sched
qconf -Msconf $SGE_TMP/sched >/dev/null
qconf -as $H >/dev/null
printf 'hostname %s\nload_scaling NONE\ncomplex_values NONE\nuser_lists NONE\nxuser_lists NONE\nprojects NONE\nxprojects NONE\nusage_scaling NONE\nreport_variables NONE\n' $H > $SGE_TMP/exec
qconf -se $H >/dev/null 2>&1 || qconf -Ae $SGE_TMP/exec >/dev/null
printf 'group_name @allhosts\nhostlist %s\n' $H > $SGE_TMP/hg
qconf -shgrp @allhosts >/dev/null 2>&1 || qconf -Ahgrp $SGE_TMP/hg >/dev/null
printf 'pe_name orte\nslots 64\nuser_lists NONE\nxuser_lists NONE\nstart_proc_args NONE\nstop_proc_args NONE\nallocation_rule $fill_up\ncontrol_slaves TRUE\njob_is_first_task FALSE\nurgency_slots min\naccounting_summary FALSE\nqsort_args NONE\n' > $SGE_TMP/pe
qconf -sp orte >/dev/null 2>&1 || qconf -Ap $SGE_TMP/pe >/dev/null
if ! qconf -sq all.q >/dev/null 2>&1; then
  qconf -sq | sed -e 's/^qname .*/qname all.q/' -e 's/^hostlist .*/hostlist @allhosts/' -e 's/^slots .*/slots 16/' \
    -e 's/^pe_list .*/pe_list make orte/' -e 's/^load_thresholds .*/load_thresholds NONE/' -e 's#^shell .*#shell /bin/bash#' > $SGE_TMP/q
  qconf -Aq $SGE_TMP/q >/dev/null
fi
/usr/sbin/sge_execd
for _i in $(seq 100); do qstat -f 2>/dev/null | grep -qE "^all.q@$H +BIP +[0-9]+/[0-9]+/16 +[0-9.]+ +lx-amd64 *$" && break; sleep 0.2; done
qmod -c all.q >/dev/null 2>&1 || true      # clear a stale error state from an earlier run
SGE_QMASTER_PID=$(cat /var/spool/gridengine/qmaster/qmaster.pid)
SGE_EXECD_PID=$(cat $(find /var/spool/gridengine/execd -name execd.pid | head -1))
