"""ps job launcher: MXNet ``tools/launch.py``'s command line (local, ssh, mpi, slurm, sge, yarn).

Run ``python -m ps.launch``, ``python -m launcher`` or ``ps-launch``; see docs/launcher.md.
"""
