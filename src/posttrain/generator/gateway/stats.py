"""The gateway's counters: a generator's (``GeneratorStats``), plus what happens to its episodes.

Published like a generator's stats (``posttrain.rollout.telemetry``: the run's telemetry hash, under
the gateway's id) at every weight check, and served at ``GET /v1/gateway/stats``. A generator's
``in_flight`` counts the admission tickets the gateway holds (one per open segment).
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.inference.metering import GeneratorStats


@dataclass
class GatewayStats(GeneratorStats):
    """``GeneratorStats`` and the gateway's own counts (episodes, requests).

    Attributes:
        turns: Turns sampled (engine calls that succeeded).
        episodes_opened: Episodes whose first turn was served.
        episodes_closed: Episodes closed by a reward call or the verifier (their rollouts sent).
        abandoned: Episodes given up: idle past ``gateway.idle_timeout_s``, open past
            ``generator.episode_timeout_s``, or still open when the gateway stopped.
        splits: New segments started because a client edited an episode's history (rule ``split``).
        history_refused: Requests refused for an edited history (rule ``refuse``).
        infra_errors: Episodes closed with ``infra_error`` (nothing trained; counted by cause in the
            admission counters too, ``client_retry_total``).
        admission_timeouts: Requests refused with 429 (no ticket within ``gateway.admission_wait_s``).
        verified: Episodes graded by the verifier.
        verifier_errors: Verifier runs that failed (the episode stayed open).
        unauthorized: Requests refused with 401.
        last_policy_version: Policy version of the last turn served.
        gate_releases: Groups of turns the batching gate let through to the engine together
            (``posttrain.generator.gateway.batching``; 0 when the engine needs no gate).
        gate_released: Turns in those groups (``gate_released / gate_releases`` turns per group).
        gate_timeouts: Groups let through at ``gateway.batch_wait_ms``, with an open episode's turn missing.
        gate_wait_s: Seconds turns waited at the gate, summed over turns.
    """

    turns: int = 0
    episodes_opened: int = 0
    episodes_closed: int = 0
    abandoned: int = 0
    splits: int = 0
    history_refused: int = 0
    infra_errors: int = 0
    admission_timeouts: int = 0
    verified: int = 0
    verifier_errors: int = 0
    unauthorized: int = 0
    last_policy_version: float = 0.0
    gate_releases: int = 0
    gate_released: int = 0
    gate_timeouts: int = 0
    gate_wait_s: float = 0.0
