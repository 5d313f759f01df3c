"""The exit statuses of ps's own processes, and which of them no restart can fix.

A cluster manager that restarts failed processes (Kubernetes' ``podFailurePolicy``,
``python -m ps.launch --launcher kubernetes --max-restarts N``) must tell a failure that
the same process, started again, may get past (a dead peer, a timeout, a lost scheduler, a
node killed by a signal) from one it will meet again every time: a missing or malformed
``DMLC_*``/``PS_*`` variable, a bad command line, an unreadable secret file. The second kind
exits :data:`CONFIG`, and the Kubernetes launcher fails the whole job on it at once instead of
spending its restarts.

78 is ``EX_CONFIG`` of BSD's sysexits.h ("configuration error"). Unlike 2 it is not what
Python (``can't open file``), argparse or a shell also use for other things, so a script's own
status is not mistaken for ps's.
"""
from __future__ import annotations

OK = 0             # the job ended well
FAILED = 1         # the job failed (a peer died, a bounded wait ran out, ...); a restart may help
CONFIG = 78        # the configuration is wrong: the same process would fail the same way again
INTERRUPTED = 130  # SIGINT (128 + 2), as a shell reports it

FATAL = (CONFIG,)  # statuses a restart cannot fix (the podFailurePolicy's FailJob codes)
