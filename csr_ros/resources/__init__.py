"""Inference resources: one interface (`base.Resource`), several backends."""

from csr_ros.resources.base import PrefillResult, QueryResult, Resource

__all__ = ["PrefillResult", "QueryResult", "Resource"]
