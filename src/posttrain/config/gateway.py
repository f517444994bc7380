"""The run config's ``gateway`` section: the rollout gateway, an OpenAI-compatible front for external agents.

``posttrain gateway CONFIG`` serves ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``
from the run's inference engine at the current policy version; every episode it serves becomes one
SAO ``Rollout`` (docs/gateway.md). ``posttrain run`` starts it with the run when ``mode`` is not
``disabled``; on a cluster the SAO JobSet gets a ``gateway`` replicated job, a Service and a
NetworkPolicy (``posttrain.cluster.gateway``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from posttrain.config.common import _Strict
from posttrain.config.resources import PodResources, fill_resources

GATEWAY_RESOURCES = PodResources(cpu="8", memory="64Gi", gpus=1, shm="16Gi")
"""Default of ``gateway.resources``: one GPU, as a generator pod."""

DEFAULT_AGENT_LABELS = {"posttrain.io/gateway-client": "true"}
"""Default of ``gateway.agent_pod_labels``: the label a tenant puts on the pods of its agents."""


class GatewayConfig(_Strict):
    """The rollout gateway: an OpenAI-compatible HTTP server whose episodes train with SAO (docs/gateway.md)."""

    mode: Literal["disabled", "with_generators", "only"] = "disabled"
    """disabled: no gateway (not ``off``, which YAML reads as false). with_generators: ``posttrain run``
    (and the SAO JobSet) also runs the gateway, beside the run's own generator processes. only: the
    gateway's episodes are the run's only rollouts (no generator process runs). ``technique: sao``
    only (SAO needs no group)."""
    host: str = Field("127.0.0.1", min_length=1, max_length=253)
    """Address the gateway listens on (``0.0.0.0`` in a cluster pod)."""
    port: int = Field(8600, ge=0, le=65535)
    """TCP port; 0 picks a free one (``posttrain run`` reads it from ``<run>/gateway/url``)."""
    model_name: str | None = Field(None, min_length=1, max_length=200)
    """The ``model`` clients must name (``/v1/models`` lists it); None: the run's ``run_name``."""
    token_env: str = Field("POSTTRAIN_GATEWAY_TOKEN", pattern=r"^[A-Z_][A-Z0-9_]{0,127}$")
    """Environment variable that holds the run's bearer token; a request without it, or with another
    token, gets 401. ``posttrain run`` creates a token per run (``<run>/gateway/token``); a cluster run
    reads it from the run's Secret."""
    edited_history: Literal["split", "refuse"] = "split"
    """What a later turn whose history differs from what the gateway produced does (docs/gateway.md,
    "The history rule"): split: the episode continues as a new segment, rendered afresh from the
    request, that becomes its own rollout (with its own admission ticket) at close; refuse: the
    request gets 400 ``history_mismatch`` and the episode is unchanged. A client may ask for the
    stricter or the other rule per episode with the ``X-Episode-History`` header."""
    wrap_tool_results: bool = True
    """True: tool results reach the policy as our environments render them (``<tool_result
    name="...">`` around each output, one ``tool`` turn per assistant turn), so gateway and
    environment episodes of the same exchange are the same tokens. False: each tool message is
    handed to the chat template as it is, for a model whose template wraps tool results itself
    (Qwen's ``<tool_response>``)."""
    verifier: Literal["none", "environment"] = "none"
    """none: an episode is closed only by a reward call. environment: an episode closed with a
    ``task_id`` (and no ``reward``) is graded by replaying its actions through the run's environment
    (``data.env``) on that training task."""
    idle_timeout_s: float = Field(120.0, gt=0.0, le=86400.0)
    """An open episode with no request for this long is abandoned: its admission tickets are
    released and it is counted (``abandoned``); later requests for it get 404."""
    admission_wait_s: float = Field(30.0, ge=0.0, le=3600.0)
    """Longest wait (seconds) of an episode's first request for an admission ticket; after it the
    request gets 429 (the episode is not opened; the client may retry)."""
    batch_wait_ms: float = Field(20.0, ge=0.0, le=10_000.0)
    """Engines that run each batch to its end (``hf``): the longest time (milliseconds) the engine is
    left idle while turns wait for the other open episodes' turns to join their batch; a turn goes
    at once when every open episode has one waiting (docs/gateway.md, "The episode's life"). 0: each turn
    goes to the engine as it arrives. vLLM batches continuously and ignores it."""
    max_request_bytes: int = Field(8 << 20, ge=1024, le=1 << 30)
    """Largest request body (bytes); a bigger one gets 413."""
    agents: int = Field(0, ge=0, le=64)
    """Example agent processes (``examples/external_agent``) that ``posttrain run`` starts as the
    gateway's traffic (needs ``verifier: environment``); 0: none, the gateway waits for outside agents."""
    agent_episodes_in_flight: int = Field(8, ge=1, le=1024)
    """Concurrent episodes of each example agent process."""
    agent_script: str = Field("examples/external_agent/agent.py", min_length=1)
    """The example agent ``posttrain run`` starts (a path relative to the current directory)."""
    agent_sandbox: bool = True
    """The example agents run their tool in posttrain's sandbox (``python -m posttrain.envs.sandbox
    --exec``), as a team's scaffold runs tools in its own; false: a plain subprocess."""
    agent_pod_labels: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_AGENT_LABELS))
    """Labels of the tenant's agent pods: the gateway's NetworkPolicy admits these pods (in the
    run's namespace) and no others."""
    resources: PodResources = GATEWAY_RESOURCES
    """What the gateway pod of the SAO JobSet asks for (cluster mode)."""

    @field_validator("resources", mode="before")
    @classmethod
    def _fill_resources(cls, value: Any) -> Any:
        return fill_resources(GATEWAY_RESOURCES, value)

    @field_validator("agent_pod_labels")
    @classmethod
    def _labels_not_empty(cls, value: dict[str, str]) -> dict[str, str]:
        """An empty selector would admit every pod of the namespace."""
        if not value:
            raise ValueError("gateway.agent_pod_labels must name at least one label (an empty selector admits every pod)")
        return value
