"""elasticps: Kubernetes-native elastic training with parameter servers."""

__version__ = "0.1.0"
