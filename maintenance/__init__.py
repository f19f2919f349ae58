"""Online HNSW maintenance for memstore: probes, policy, safe actions, history and the cron CLI.

Import :class:`maintenance.worker.MaintenanceWorker` to run it in-process; ``memstore-maint`` runs it
from cron or as a daemon. Design and measurements: docs/maintenance.md.
"""

from maintenance.config import MaintenanceConfig

__all__ = ["MaintenanceConfig"]
