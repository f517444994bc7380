"""Where the learner computes and how it spreads over ranks: device, precision, FSDP2, row shares.

Built on PyTorch's own distributed stack (``torch.distributed``, FSDP2's ``fully_shard``,
``torch.distributed.checkpoint``), launched by ``torchrun``. With one process nothing is sharded
and every helper is the identity, so the CPU path of a single learner is what it always was.

- ``world``: the process group (``World``: rank, size, device, all-reduce and byte broadcast).
- ``placement``: device and precision choice, activation checkpointing, FSDP2 sharding per
  transformer block, and gathering a full state dict for publication and export.
- ``shares``: which rows of a batch each rank trains, with equal micro-batch counts on every rank.
"""
