"""Inference resources: one interface (`base.Resource`, with `Capabilities`), several backends."""

from csr_ros.resources.base import Capabilities, PrefillResult, QueryResult, Resource

__all__ = ["Capabilities", "PrefillResult", "QueryResult", "Resource"]
