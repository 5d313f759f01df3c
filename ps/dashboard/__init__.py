"""The dashboard: the scheduler serves the job's live state over HTTP (PS_DASHBOARD,
``python -m ps.launch --dashboard``): a page for a browser, ``/metrics`` for Prometheus,
``/api/...`` as JSON. Read-only: no request changes the job. docs/dashboard.md.
"""
from .server import Dashboard

__all__ = ["Dashboard"]
