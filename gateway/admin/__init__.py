"""The web console (/admin) and the JSON admin API (/admin/api/); see docs/operations.md."""

from gateway.admin.app import build_admin, mount
from gateway.admin.operations import Operations

__all__ = ["Operations", "build_admin", "mount"]
