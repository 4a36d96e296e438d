"""Decentralized training (``spec.strategy: decentralized``, seed 004's Hop): workers average their
models with their neighbours in a graph, coordinated by update and token queues, without a PS."""
