"""The rollout stream between generators and the learner, and staleness control.

* ``queue``: the ``RolloutQueue`` / ``PolicyVersionStore`` Protocols and ``QueueEntry``.
* ``redis_streams``: ``RedisStreamQueue`` and ``RedisPolicyVersionStore`` (Redis Streams).
* ``memory_queue``: ``MemoryRolloutQueue`` and ``MemoryPolicyVersionStore`` (in-process twin).
* ``admission``: admission tickets (``RedisAdmissionController``, ``MemoryAdmissionController``),
  ``is_stale`` and ``StalenessStats``.
* ``keys``: ``StreamKeys``, the Redis key names of a run.

Submodules are imported on use; importing this package does not import redis.
"""
