"""The worker's side of the parameter servers: one client over every PS shard.

``client.py`` pushes and pulls whole models over all shards at once; ``sharding.py`` places each
tensor on a shard (a pure function every worker computes alike); ``routes.py`` picks each shard's
transport (its bulk channel, else gRPC frames). The wire codecs shared with the server live in
``rpc/``. The PS server (``ps/``) never imports this package, nor this package the server.
"""
