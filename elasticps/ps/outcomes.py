"""What a push comes to on this shard, as the update rules, the arrivals of a sync round and the
store report it (the servicer turns it into a ``PushReply``). Kept below all three so none of them
imports another for it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PushOutcome:
    accepted: bool  # async: applied; sync: staged for the round
    version: int  # the store's version after this push
    staleness: int
    learning_rate: float  # the learning rate this push was (or will be) applied with (0 when refused)
