"""The rollout gateway: an OpenAI-compatible server over the generator's engine whose episodes train with SAO.

Any agent built on an OpenAI client becomes a source of rollouts, token for token: ``posttrain gateway
CONFIG`` serves ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` at the run's current
policy version; each episode (opened by a path segment or a header, closed by a reward call or the
run's verifier) becomes one ``Rollout`` on the run's stream (docs/gateway.md).

Modules: ``protocol`` (the API's shapes and error object), ``history`` (the rule for edited
histories), ``render`` (API messages in the policy's chat format), ``episodes`` (token records and
the open episodes), ``verifier`` (grading by the run's environment), ``service`` (one turn, close,
abandon), ``app`` (the HTTP routes), ``stats``, ``serve`` (the process).
"""
