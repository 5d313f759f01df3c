"""Horovod keeps its launcher helpers here; ps has only ``threads.in_thread``."""
