"""The PyTorch backend (``spec.model.framework: torch``): a model module's ``nn.Module`` trained by
the PS's optimizers (``model_loading.py`` has the contract). Only this package imports torch."""
