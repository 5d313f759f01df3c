"""ps against MXNet's native parameter server on this machine (``python -m ps.bench``).

``cli`` parses options and runs the cases; ``cluster`` starts and drives real jobs on
127.0.0.1; ``worker`` is the driver each worker process runs (``gluon`` for the Gluon
steps); ``measure`` reads memory, ports and CPU; ``report`` makes the tables, CSV and
chart; ``soak`` is the long reliability run (``python -m ps.bench.soak``). Nothing here
is imported by the runtime.
"""
