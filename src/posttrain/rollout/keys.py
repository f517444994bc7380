"""Redis key names of one run: rollout stream, dead letters, policy version, admission, telemetry, stop, weights.

Every key of a run starts with ``<prefix>:<run>:``, so a tenant's Redis ACL can grant exactly
``~<prefix>:*`` and nothing else. Run ``python -m posttrain.rollout.keys PREFIX RUN`` to print the
keys of a run.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")
_RUN_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


@dataclass(frozen=True)
class StreamKeys:
    """Key names of one run (same patterns as ``QueueConfig.key_prefix`` and ``RunConfig.run_name``).

    Attributes:
        prefix: Tenant/run-family prefix, ``[A-Za-z0-9_.:-]{1,200}`` (``posttrain``, ``team-a:prod``).
        run: Run name, ``[A-Za-z0-9_.-]{1,100}``; no colon, so a run cannot reach into another's keys.

    Raises:
        ValueError: ``prefix`` or ``run`` does not match its pattern (the message names the field).
    """

    prefix: str
    run: str

    def __post_init__(self) -> None:
        if not _PREFIX_RE.match(self.prefix):
            raise ValueError(f"prefix: {self.prefix!r} must match {_PREFIX_RE.pattern}")
        if not _RUN_RE.match(self.run):
            raise ValueError(f"run: {self.run!r} must match {_RUN_RE.pattern}")

    @property
    def base(self) -> str:
        """``<prefix>:<run>``: the common start of every key of this run."""
        return f"{self.prefix}:{self.run}"

    @property
    def rollouts(self) -> str:
        """Redis Stream of encoded ``Rollout`` records (generators XADD, the learner group reads)."""
        return f"{self.base}:rollouts"

    @property
    def dead_letter(self) -> str:
        """Redis Stream of entries that could not be decoded: fields ``reason``, ``original_id``, ``payload``."""
        return f"{self.base}:dead_letter"

    @property
    def policy_version(self) -> str:
        """String key holding the learner's current policy version (decimal integer)."""
        return f"{self.base}:policy_version"

    @property
    def admission(self) -> str:
        """Hash of admission counters: ``consumed`` (rollouts on the stream and not refunded) and totals."""
        return f"{self.base}:admission"

    @property
    def admission_leases(self) -> str:
        """Sorted set of in-flight admission tickets, scored by lease expiry (Unix seconds)."""
        return f"{self.base}:admission:leases"

    @property
    def admission_owners(self) -> str:
        """Hash of in-flight ticket id -> generator id, so a dead generator's leases can be returned at once."""
        return f"{self.base}:admission:owners"

    @property
    def admission_tasks(self) -> str:
        """Hash of in-flight ticket id -> the task its episode runs (``ReissuedTask`` JSON), re-issued if lost."""
        return f"{self.base}:admission:tasks"

    @property
    def admission_refunded(self) -> str:
        """Set of stream entry ids whose admission place the learner refunded and has not yet acknowledged."""
        return f"{self.base}:admission:refunded"

    @property
    def reissue(self) -> str:
        """List of tasks to run again (``ReissuedTask`` JSON): infrastructure failures and episodes lost in flight."""
        return f"{self.base}:reissue"

    @property
    def generators(self) -> str:
        """Set of the generator ids that ever sent a heartbeat in this run."""
        return f"{self.base}:generators"

    @property
    def heartbeat_prefix(self) -> str:
        """Start of the per-generator heartbeat keys (``heartbeat(generator_id)``)."""
        return f"{self.base}:alive:"

    def heartbeat(self, generator_id: str) -> str:
        """String key with a TTL that a live generator keeps renewing (``posttrain.rollout.liveness``)."""
        return f"{self.heartbeat_prefix}{generator_id}"

    @property
    def generator_stats(self) -> str:
        """Hash of generator id -> JSON stats (``posttrain.rollout.telemetry``); generators write, the learner reads."""
        return f"{self.base}:generator_stats"

    @property
    def generator_positions(self) -> str:
        """Hash of generator index -> episode counters reserved so far (``posttrain.generator.seeds``).

        A restarted generator continues its episode numbering there instead of replaying its seeds;
        the learner's checkpoints keep a copy for a Redis that loses its data (``posttrain.rollout.positions``).
        """
        return f"{self.base}:generator_positions"

    @property
    def stop(self) -> str:
        """String key whose presence tells the run's generators to finish."""
        return f"{self.base}:stop"

    @property
    def weights(self) -> str:
        """Pub/sub channel of new-weights announcements (``posttrain.weight_sync.announce``)."""
        return f"{self.base}:weights"

    @property
    def acl_pattern(self) -> str:
        """Key pattern a tenant ACL grants (``~<prefix>:*``); matches every key of every run of the prefix."""
        return f"{self.prefix}:*"

    def all_keys(self) -> dict[str, str]:
        """Every key of the run by role: ``{"rollouts": "...", "dead_letter": "...", ...}``."""
        return {
            "rollouts": self.rollouts,
            "dead_letter": self.dead_letter,
            "policy_version": self.policy_version,
            "admission": self.admission,
            "admission_leases": self.admission_leases,
            "admission_owners": self.admission_owners,
            "admission_tasks": self.admission_tasks,
            "admission_refunded": self.admission_refunded,
            "reissue": self.reissue,
            "generators": self.generators,
            "generator_stats": self.generator_stats,
            "generator_positions": self.generator_positions,
            "stop": self.stop,
            "weights": self.weights,
        }


def main(argv: list[str]) -> int:
    """Print the keys of ``PREFIX RUN`` one per line; return a process exit code."""
    if len(argv) != 2:
        print("usage: python -m posttrain.rollout.keys PREFIX RUN", file=sys.stderr)
        return 2
    keys = StreamKeys(prefix=argv[0], run=argv[1])
    for role, key in keys.all_keys().items():
        print(f"{role}\t{key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
