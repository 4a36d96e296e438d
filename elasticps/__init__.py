"""elasticps: Kubernetes-native elastic training with parameter servers.

Model modules import :class:`Mode` (and :class:`Metadata`) from here: ``from elasticps import Mode``.
"""

from elasticps.model_contract import Metadata, Mode

__version__ = "0.1.0"
__all__ = ["Metadata", "Mode", "__version__"]
