"""The time account of a run: each role's wall time split into named shares that add up by construction.

Issue 35. Try it: ``python -c "from posttrain.account import StateClock; c = StateClock(('a', 'b'));
c.switch('b'); print(c.shares())"``.

Two clocks, both state machines, so the shares add up to the wall time by construction (never a sum
of separately timed intervals that could overlap or leave gaps):

* ``StateClock``: one thing (an engine, a learner) is always in exactly one state; ``switch``
  closes the current state's interval and opens the next; ``other`` holds whatever no named state
  covers. ``sum(shares().values()) == wall_s()`` up to float rounding.
* ``Occupancy``: ``units`` things (the episode slots of a generator) each in one state; ``set``
  gives the count in each state at this moment (they must add up to ``units``); the account is in
  unit-seconds and adds up to ``units x wall``.

What each role's states mean (and the priority that picks one when several hold at once) is
defined where the role's events are: ``posttrain.inference.metering`` (generator engine and
episode slots), ``posttrain.learner.loop`` and ``posttrain.runners.common`` (learner). The
definitions are collected in docs/kubeflow.md ("time account").

``RoleAccount`` and ``RunAccount`` are the records: a role's shares plus requested and used
CPU-seconds (requested = the role's wall x its requested cores from the config's ``resources``;
used = the process's CPU time, or the engine's busy time for a generator engine: ``used_by`` says
which), and the derived cost per trained token and per point of held-out accuracy gained. They are
JSON (``to_json``), never pickle; ``account.json`` in MLflow is ``RunAccount.to_json()``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

OTHER = "other"
"""The share of a clock's time that no named state covers (setup, logging, shutdown)."""

ADD_UP_TOLERANCE = 0.02
"""Largest relative gap between a role's shares and its wall time that ``RoleAccount.check`` accepts."""

ACCOUNT_SCHEMA_VERSION = 1
"""Version of ``account.json``; bump on an incompatible change."""

TENANT_ENV = "POSTTRAIN_TENANT"
"""Environment variable naming the run's tenant (a tenant's ConfigMap sets it: ``posttrain.cluster.tenant``)."""

LEARNER_ACCOUNT_FILE_ENV = "POSTTRAIN_LEARNER_ACCOUNT_FILE"
"""Set by a local run that starts the learner's ranks under torchrun (``runners.sao.run_learner_ranks``):
rank 0 writes its clock's account there (``StateClock.record`` plus ``carried``) for the parent to fold
into the run's account, instead of recording one of its own (a cluster pod's learner records its own)."""

DEFAULT_TENANT = "default"
"""The tenant of a run outside any tenant's namespace."""


def run_tenant() -> str:
    """The run's tenant: ``POSTTRAIN_TENANT``, else ``default``."""
    return os.environ.get(TENANT_ENV, "").strip() or DEFAULT_TENANT


LEARNER_STATES = ("preparing", "warm_start", "evaluating", "training", "waiting_for_batch", "publishing",
                  "checkpointing", "registering")
"""The learner process's states (``posttrain.runners.common.TrackedRun.clock``): ``preparing`` the
tokenizer and base model, the SFT ``warm_start``, held-out ``evaluating``, ``training`` (forward,
backward, optimizer step), ``waiting_for_batch`` (rollouts: the stream, or synchronous GRPO's
generation), ``publishing`` a policy version (and synchronous GRPO's engine reload),
``checkpointing``, ``registering`` the final model; ``other`` for the rest (logging, final model)."""


class StateClock:
    """One thing's wall time split by state; exactly one state at a time (module docstring).

    Args:
        states: The named states, in report order; ``other`` is added when missing.
        initial: The state at start (default ``other``).
        clock: Seconds, monotonic (``time.monotonic``; tests pass their own).

    Raises:
        ValueError: ``initial`` is not one of ``states``, or a state name repeats.
    """

    def __init__(self, states: Iterable[str], initial: str = OTHER, clock: Callable[[], float] = time.monotonic) -> None:
        names = list(states)
        if OTHER not in names:
            names.append(OTHER)
        if len(set(names)) != len(names):
            raise ValueError(f"states: a name repeats in {names}")
        if initial not in names:
            raise ValueError(f"initial: {initial!r} is not one of {names}")
        self._clock = clock
        self._seconds = dict.fromkeys(names, 0.0)
        self._state = initial
        self._started = self._since = clock()
        self._cpu_started = time.process_time()
        self.carried_cpu_s = 0.0
        """CPU-seconds of earlier lives (``carry``), added to this process's own."""
        self.lives = 1
        """Process lives this clock sums: 1, plus the earlier lives ``carry`` added."""
        self.carried: dict[str, float] = {}
        """Seconds by state that ``carry`` added (the earlier lives' shares)."""

    @property
    def state(self) -> str:
        """The current state."""
        return self._state

    def switch(self, state: str) -> str:
        """Enter ``state`` now (a no-op when already in it); returns the state left.

        Raises:
            ValueError: ``state`` is not one of the clock's states.
        """
        if state not in self._seconds:
            raise ValueError(f"state: {state!r} is not one of {list(self._seconds)}")
        previous = self._state
        if state != previous:
            now = self._clock()
            self._seconds[previous] += now - self._since
            self._state, self._since = state, now
        return previous

    def wall_s(self) -> float:
        """Seconds since the clock started (plus the earlier lives ``carry`` added)."""
        return self._clock() - self._started

    def shares(self) -> dict[str, float]:
        """Seconds spent in each state so far (the current one up to now); they add up to ``wall_s()``."""
        out = dict(self._seconds)
        out[self._state] += self._clock() - self._since
        return out

    def cpu_s(self) -> float:
        """CPU-seconds of this process since the clock started, plus the earlier lives' (``carry``)."""
        return time.process_time() - self._cpu_started + self.carried_cpu_s

    def carry(self, record: Mapping[str, Any]) -> None:
        """Add an earlier life's account (a ``record()`` read back from a checkpoint) to this clock.

        A restarted process (a learner resumed after a crash or an eviction) sums its lives: each
        state's seconds are added, the wall time grows by their sum (so the shares still add up to
        ``wall_s``), the CPU-seconds and the count of lives too. A state this clock does not know (a
        record of another version) is added to ``other``: no second is dropped.

        Raises:
            ValueError: a record that is not ``{"shares": {state: seconds >= 0}, ...}`` (the field named).
        """
        shares = record.get("shares")
        if not isinstance(shares, Mapping):
            raise ValueError(f"account record: 'shares' must be a mapping of state to seconds, got {shares!r}")
        for name, seconds in shares.items():
            if not isinstance(seconds, int | float) or seconds < 0:
                raise ValueError(f"account record: shares[{name!r}] = {seconds!r} must be seconds >= 0")
            key = name if name in self._seconds else OTHER
            self._seconds[key] += float(seconds)
            self.carried[key] = self.carried.get(key, 0.0) + float(seconds)
            self._started -= float(seconds)
        self.carried_cpu_s += float(record.get("used_cpu_s", 0.0))
        self.lives += int(record.get("lives", 1))

    def reassign(self, source: str, shares: Mapping[str, float], limit_s: float) -> None:
        """Move seconds already counted in ``source`` to other states: another process's split of that time.

        The learner's ranks under torchrun run in child processes; the parent's clock counts their
        run in ``source`` and then takes rank 0's split (``shares``, this life only). At most
        ``limit_s`` seconds (the child's run as the parent timed it) and never more than ``source``
        holds move: when ``shares`` add up to more, each is scaled down alike. The wall time is
        unchanged, so the shares still add up to it.

        Raises:
            ValueError: a state the clock does not know, or a negative share (named).
        """
        for name, seconds in shares.items():
            if name not in self._seconds:
                raise ValueError(f"state: {name!r} is not one of {list(self._seconds)}")
            if seconds < 0:
                raise ValueError(f"shares[{name!r}] = {seconds!r} must be seconds >= 0")
        total = sum(shares.values())
        room = min(limit_s, self.shares()[source])
        scale = min(1.0, room / total) if total > 0 else 0.0
        for name, seconds in shares.items():
            self._seconds[source] -= seconds * scale
            self._seconds[name] += seconds * scale

    def record(self) -> dict[str, Any]:
        """This clock's account now as JSON-ready numbers (what a checkpoint keeps; ``carry`` reads it back).

        Keys: ``shares`` (seconds by state, every life), ``used_cpu_s`` (every life), ``lives``.
        """
        return {"shares": self.shares(), "used_cpu_s": self.cpu_s(), "lives": self.lives}


class StateTimer:
    """``with timer("training"): ...``: a ``StateClock`` that returns to the previous state afterwards.

    Args:
        clock: The clock to switch.
    """

    def __init__(self, clock: StateClock) -> None:
        self.clock = clock

    def __call__(self, state: str) -> _Scope:
        """A context manager that holds ``state`` for its body."""
        return _Scope(self.clock, state)


class _Scope:
    def __init__(self, clock: StateClock, state: str) -> None:
        self.clock, self.state, self.previous = clock, state, OTHER

    def __enter__(self) -> None:
        self.previous = self.clock.switch(self.state)

    def __exit__(self, *exc: object) -> None:
        self.clock.switch(self.previous)


class Occupancy:
    """``units`` things' wall time split by state, in unit-seconds (module docstring).

    Args:
        states: The named states; ``other`` is added when missing. At start every unit is in ``other``.
        units: How many things (>= 1), e.g. a generator's episode capacity.
        clock: Seconds, monotonic.

    Raises:
        ValueError: ``units`` < 1, or a state name repeats.
    """

    def __init__(self, states: Iterable[str], units: int, clock: Callable[[], float] = time.monotonic) -> None:
        if units < 1:
            raise ValueError(f"units: {units} must be >= 1")
        names = list(states)
        if OTHER not in names:
            names.append(OTHER)
        if len(set(names)) != len(names):
            raise ValueError(f"states: a name repeats in {names}")
        self.units = units
        self._clock = clock
        self._seconds = dict.fromkeys(names, 0.0)
        self._counts = dict.fromkeys(names, 0)
        self._counts[OTHER] = units
        self._started = self._since = clock()

    def set(self, counts: Mapping[str, int]) -> None:
        """From now on, ``counts[s]`` units are in state ``s``; the rest (``units`` minus their sum) in ``other``.

        Counts are clipped so that they never add up to more than ``units`` (in the order given).

        Raises:
            ValueError: a state that is not one of the occupancy's, or a negative count.
        """
        now = self._clock()
        for name, n in self._counts.items():
            self._seconds[name] += n * (now - self._since)
        self._since = now
        left = self.units
        fresh = dict.fromkeys(self._counts, 0)
        for name, n in counts.items():
            if name not in fresh or name == OTHER:
                raise ValueError(f"state: {name!r} is not one of {[s for s in fresh if s != OTHER]}")
            if n < 0:
                raise ValueError(f"{name}: count {n} must be >= 0")
            fresh[name] = min(n, left)
            left -= fresh[name]
        fresh[OTHER] = left
        self._counts = fresh

    def carry(self, shares: Mapping[str, float]) -> None:
        """Add an earlier life's unit-seconds by state (a restarted generator's); unknown states go to ``other``.

        Raises:
            ValueError: a negative or non-numeric share (named).
        """
        for name, seconds in shares.items():
            if not isinstance(seconds, int | float) or seconds < 0:
                raise ValueError(f"slot account: shares[{name!r}] = {seconds!r} must be unit-seconds >= 0")
            self._seconds[name if name in self._seconds else OTHER] += float(seconds)
            self._started -= float(seconds) / self.units

    def wall_s(self) -> float:
        """Seconds since the occupancy started."""
        return self._clock() - self._started

    def shares(self) -> dict[str, float]:
        """Unit-seconds in each state so far; they add up to ``units x wall_s()``."""
        now = self._clock()
        return {name: s + self._counts[name] * (now - self._since) for name, s in self._seconds.items()}


@dataclass
class RoleAccount:
    """One role's time account (one process, or the same role summed over processes).

    Attributes:
        role: ``learner``, ``generator`` (its engine) or ``generator_slots`` (episode capacity).
        wall_s: The role's wall time (seconds; summed over processes; for ``generator_slots``
            unit-seconds: slots x wall).
        shares: Seconds (unit-seconds) in each state; they add up to ``wall_s``.
        requested_cpu_s: CPU-seconds requested: ``wall_s`` x the role's requested cores
            (``<role>.resources.cpu``); 0 for ``generator_slots``.
        used_cpu_s: CPU-seconds used, measured as ``used_by`` says.
        used_by: ``process_cpu`` (the process's CPU time, all threads) or ``engine_busy`` (seconds the
            engine ran a batch, ``GeneratorStats.busy_s``).
        processes: Processes summed into this account (process lives: a restarted learner or generator
            counts each life; synchronous GRPO counts each rank's engine).
        requested_gpu_s: Accelerator-seconds requested: ``wall_s`` x ``<role>.resources.gpus`` (what a
            GPU cluster charges; the CPU runs here request none, so it is reported beside the CPU figure).
    """

    role: str
    wall_s: float
    shares: dict[str, float]
    requested_cpu_s: float = 0.0
    used_cpu_s: float = 0.0
    used_by: str = "process_cpu"
    processes: int = 1
    requested_gpu_s: float = 0.0

    def gap(self) -> float:
        """``|sum(shares) - wall_s| / wall_s`` (0 when the wall time is 0)."""
        return abs(sum(self.shares.values()) - self.wall_s) / self.wall_s if self.wall_s > 0 else 0.0

    def check(self, tolerance: float = ADD_UP_TOLERANCE) -> None:
        """Raise when the shares do not add up to the wall time within ``tolerance`` (relative).

        Raises:
            ValueError: the message names the role, the sum and the wall time.
        """
        if self.gap() > tolerance:
            raise ValueError(f"time account of {self.role}: shares add up to {sum(self.shares.values()):.3f} s, "
                             f"wall time {self.wall_s:.3f} s (gap {self.gap():.1%} > {tolerance:.0%})")

    def fractions(self) -> dict[str, float]:
        """Each share as a fraction of ``wall_s`` (0 when the wall time is 0)."""
        return {k: (v / self.wall_s if self.wall_s > 0 else 0.0) for k, v in self.shares.items()}

    @classmethod
    def from_clock(cls, role: str, clock: StateClock | Occupancy, *, cores: float = 0.0, used_cpu_s: float = 0.0,
                   used_by: str = "process_cpu") -> RoleAccount:
        """The account of a clock now; ``cores`` requested cores (requested = wall x cores)."""
        shares = clock.shares()
        wall = sum(shares.values())  # the same instant as the shares: exactly their sum
        units = clock.units if isinstance(clock, Occupancy) else 1
        return cls(role, wall, shares, requested_cpu_s=wall / units * cores, used_cpu_s=used_cpu_s, used_by=used_by)

    @classmethod
    def summed(cls, role: str, accounts: Iterable[RoleAccount]) -> RoleAccount | None:
        """Several processes' accounts of one role added up (shares by name); None when there are none."""
        items = list(accounts)
        if not items:
            return None
        shares: dict[str, float] = {}
        for a in items:
            for k, v in a.shares.items():
                shares[k] = shares.get(k, 0.0) + v
        return cls(role, sum(a.wall_s for a in items), shares, sum(a.requested_cpu_s for a in items),
                   sum(a.used_cpu_s for a in items), items[0].used_by, sum(a.processes for a in items),
                   sum(a.requested_gpu_s for a in items))

    def flat(self, prefix: str) -> dict[str, float]:
        """Flat numbers for a JSON hash or metrics: ``<prefix><share>_s``, ``<prefix>wall_s``, CPU-seconds."""
        out = {f"{prefix}{k}_s": v for k, v in self.shares.items()}
        out.update({f"{prefix}wall_s": self.wall_s, f"{prefix}requested_cpu_s": self.requested_cpu_s,
                    f"{prefix}used_cpu_s": self.used_cpu_s, f"{prefix}requested_gpu_s": self.requested_gpu_s})
        return out

    @classmethod
    def from_flat(cls, role: str, values: Mapping[str, float], prefix: str, used_by: str) -> RoleAccount | None:
        """The inverse of ``flat`` (None when ``values`` holds no ``<prefix>wall_s``)."""
        if f"{prefix}wall_s" not in values:
            return None
        skip = {"wall_s", "requested_cpu_s", "used_cpu_s", "requested_gpu_s"}
        shares = {k[len(prefix):-2]: float(v) for k, v in values.items()
                  if k.startswith(prefix) and k.endswith("_s") and k[len(prefix):] not in skip}
        return cls(role, float(values[f"{prefix}wall_s"]), shares, float(values.get(f"{prefix}requested_cpu_s", 0.0)),
                   float(values.get(f"{prefix}used_cpu_s", 0.0)), used_by,
                   requested_gpu_s=float(values.get(f"{prefix}requested_gpu_s", 0.0)))


@dataclass
class RunAccount:
    """A run's time account: its roles, its labels, and what the CPU-seconds bought.

    Attributes:
        tenant: The team (``POSTTRAIN_TENANT``; ``default`` outside a tenant namespace).
        technique: ``sft``, ``dpo``, ``grpo``, ``sao``, ``gkd``...
        month: ``YYYY-MM`` (UTC) the run ended in.
        roles: The roles' accounts.
        trained_tokens: Action (supervised: target) tokens trained.
        heldout_before: Held-out accuracy of the warm start (None when no eval ran before).
        heldout_after: Held-out accuracy after training (None when no eval ran).
        variant: ``sync`` / ``async`` for GRPO, else empty.
        outcome: ``finished``, ``failed`` for a run that raised (its account up to the error: the
            resources were spent all the same, so a tenant's report counts them), or ``interrupted`` for
            one stopped by a signal (Ctrl-C, SIGTERM; charged the same way, reported apart).
        requested_by: What "requested" was measured against: ``cluster pod requests`` (each role's
            ``resources``) or ``local`` (the cores and GPUs the machine gave the run,
            ``posttrain.runners.accounting.local_resources``).
    """

    tenant: str
    technique: str
    month: str
    roles: list[RoleAccount] = field(default_factory=list)
    trained_tokens: float = 0.0
    heldout_before: float | None = None
    heldout_after: float | None = None
    variant: str = ""
    outcome: str = "finished"
    requested_by: str = "cluster pod requests"

    def requested_cpu_s(self) -> float:
        """CPU-seconds requested by every role (the cost a quota is charged)."""
        return sum(r.requested_cpu_s for r in self.roles)

    def requested_gpu_s(self) -> float:
        """Accelerator-seconds requested by every role (``resources.gpus`` x wall)."""
        return sum(r.requested_gpu_s for r in self.roles)

    def used_cpu_s(self) -> float:
        """CPU-seconds used by every role (as each role's ``used_by`` measures)."""
        return sum(r.used_cpu_s for r in self.roles)

    def derived(self) -> dict[str, float]:
        """The cost figures: CPU-seconds requested and used, per trained token, per held-out point.

        Keys: ``cost/requested_cpu_s``, ``cost/used_cpu_s``, ``cost/trained_tokens``,
        ``cost/requested_cpu_s_per_trained_token`` (with trained tokens) and, where held-out accuracy
        was measured before and after, ``cost/heldout_points_gained`` and (with a gain)
        ``cost/requested_cpu_s_per_point``: per percentage point gained against the warm start.
        """
        out = {"cost/requested_cpu_s": self.requested_cpu_s(), "cost/used_cpu_s": self.used_cpu_s(),
               "cost/requested_gpu_s": self.requested_gpu_s(), "cost/trained_tokens": self.trained_tokens}
        if self.trained_tokens > 0:
            out["cost/requested_cpu_s_per_trained_token"] = self.requested_cpu_s() / self.trained_tokens
        if self.heldout_before is not None and self.heldout_after is not None:
            points = 100.0 * (self.heldout_after - self.heldout_before)
            out["cost/heldout_points_gained"] = points
            if points > 0:
                out["cost/requested_cpu_s_per_point"] = self.requested_cpu_s() / points
        return out

    def metrics(self) -> dict[str, float]:
        """MLflow metrics of the account.

        ``time/<role>/<share>_s``, ``time/<role>/<share>_share``, ``time/<role>/wall_s``, CPU-seconds
        per role, and ``derived()``.
        """
        out: dict[str, float] = {}
        for r in self.roles:
            out.update(r.flat(f"time/{r.role}/"))
            out.update({f"time/{r.role}/{k}_share": v for k, v in r.fractions().items()})
        out.update(self.derived())
        return out

    def tags(self) -> dict[str, str]:
        """MLflow tags that ``posttrain cost report`` selects and groups runs by."""
        return {"posttrain.tenant": self.tenant, "posttrain.technique": self.technique,
                "posttrain.month": self.month, "posttrain.account": "1", "posttrain.outcome": self.outcome,
                "posttrain.requested_by": self.requested_by}

    def to_json(self) -> str:
        """``account.json``: schema version, labels, roles, derived figures."""
        body: dict[str, Any] = {"schema_version": ACCOUNT_SCHEMA_VERSION, **asdict(self), "derived": self.derived()}
        return json.dumps(body, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunAccount:
        """Parse ``account.json``.

        Raises:
            ValueError: not JSON, another schema version, or a missing field (named).
        """
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"account.json: not JSON ({exc})") from exc
        if body.get("schema_version") != ACCOUNT_SCHEMA_VERSION:
            raise ValueError(f"account.json: schema_version {body.get('schema_version')!r}, "
                             f"expected {ACCOUNT_SCHEMA_VERSION}")
        try:
            roles = [RoleAccount(**r) for r in body["roles"]]
            return cls(body["tenant"], body["technique"], body["month"], roles, body["trained_tokens"],
                       body["heldout_before"], body["heldout_after"], body.get("variant", ""),
                       body.get("outcome", "finished"), body.get("requested_by", "cluster pod requests"))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"account.json: missing or bad field ({exc})") from exc

    def lines(self) -> list[tuple[str, str]]:
        """Summary rows: one per role (its wall time and largest shares), then the cost figures."""
        rows = []
        for r in self.roles:
            unit = "slot-s" if r.role == "generator_slots" else "s"
            parts = ", ".join(f"{k} {v:.0%}" for k, v in sorted(r.fractions().items(), key=lambda kv: -kv[1]) if v >= 0.005)
            rows.append((f"time: {r.role} ({r.wall_s:.0f} {unit})", parts or "-"))
        d = self.derived()
        cost = f"{d['cost/requested_cpu_s']:.0f} requested ({self.requested_by}), {d['cost/used_cpu_s']:.0f} used"
        if d["cost/requested_gpu_s"] > 0:
            cost += f"; {d['cost/requested_gpu_s']:.0f} GPU-seconds requested"
        if "cost/requested_cpu_s_per_trained_token" in d:
            cost += f"; {d['cost/requested_cpu_s_per_trained_token'] * 1000:.2f} requested per 1k trained tokens"
        if "cost/requested_cpu_s_per_point" in d:
            cost += f"; {d['cost/requested_cpu_s_per_point']:.0f} per held-out point gained"
        rows.append(("cost (CPU-seconds)", cost))
        return rows


def month_of(unix_s: float | None = None) -> str:
    """``YYYY-MM`` (UTC) of a Unix time in seconds (now when None)."""
    return time.strftime("%Y-%m", time.gmtime(time.time() if unix_s is None else unix_s))
