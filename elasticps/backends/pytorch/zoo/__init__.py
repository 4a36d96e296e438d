"""Example PyTorch model modules (the contract: ``elasticps/backends/pytorch/model_loading.py``)."""
