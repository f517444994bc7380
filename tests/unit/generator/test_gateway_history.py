"""The gateway's pure parts: API messages in the policy's chat format, the history rule, segments.

Tokens rendered here are compared with what the environment loop renders for the same exchange,
so a gateway episode and an environment episode of the same turns are the same token ids.
"""

from __future__ import annotations

import json

import pytest

from fixtures_models import TinyModel
from posttrain.chat.format import ChatFormat
from posttrain.chat.openai import ApiToolCall, action_text, observation_text, split_action
from posttrain.envs.synthetic.tool import SyntheticToolEnv, reference_episode
from posttrain.envs.tool_calls import format_tool_result
from posttrain.generator.gateway.episodes import Episode, EpisodeBook, Segment
from posttrain.generator.gateway.history import canonical, check_history
from posttrain.generator.gateway.protocol import ChatMessage, GatewayError
from posttrain.generator.gateway.render import template_messages
from posttrain.models.hf import load_tokenizer
from posttrain.records import decode_rollout, encode_rollout
from posttrain.rollout.admission import Ticket


def _msg(**kw) -> ChatMessage:
    return ChatMessage.model_validate(kw)


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "7*8+5"}}</tool_call>'


def test_an_action_with_a_tool_call_becomes_an_api_message_and_back():
    content, calls = split_action("Let me compute. " + CALL, ["call_a"])
    assert content == "Let me compute."
    assert calls == [ApiToolCall("call_a", "calculator", '{"expression":"7*8+5"}')]
    # back to the text the policy writes (what a recorded trace is rendered as)
    again = action_text(content, calls)
    assert again.endswith(CALL) and again.startswith("Let me compute.")


def test_an_action_without_calls_or_with_a_broken_call_is_plain_content():
    assert split_action("#### 61", []) == ("#### 61", [])
    broken = '<tool_call>{"name": </tool_call>'
    assert split_action(broken, ["x"]) == (broken, [])


def test_tool_messages_render_exactly_as_the_environment_observation(tiny_model: TinyModel):
    """The calculator's answer to a tool call: the gateway's tokens equal the environment loop's."""
    tok = load_tokenizer(tiny_model.path)
    chat = ChatFormat.for_tokenizer(tok)
    env = SyntheticToolEnv()
    task = env.tasks("train", 1)[0]
    # the environment's own observation for the reference call
    import asyncio

    episode = env.start(task)
    step = asyncio.run(episode.step(reference_episode(task)[0]))
    env_ids = chat.turn_ids("tool", step.observation)
    # the gateway: the agent answers the call with the plain output
    value = step.observation.split("\n")[1]
    rendered = template_messages([_msg(role="tool", tool_call_id="call_1", content=value)], calls={"call_1": "calculator"})
    assert rendered == [{"role": "tool", "content": format_tool_result("calculator", value)}]
    assert chat.observation_ids(rendered) == env_ids


def test_several_tool_messages_are_one_observation_joined_by_newlines():
    rendered = template_messages(
        [_msg(role="tool", tool_call_id="a", content="1"), _msg(role="tool", tool_call_id="b", content="2"),
         _msg(role="user", content="and?")], calls={"a": "calculator", "b": "python"})
    assert rendered == [{"role": "tool", "content": observation_text([("calculator", "1"), ("python", "2")])},
                        {"role": "user", "content": "and?"}]


def test_unwrapped_tool_results_go_to_the_template_one_message_each(tiny_model: TinyModel):
    """``gateway.wrap_tool_results: false``: for a template that wraps tool results itself (Qwen's)."""
    messages = [_msg(role="tool", tool_call_id="a", content="1"), _msg(role="tool", tool_call_id="b", content="2")]
    rendered = template_messages(messages, calls={"a": "calculator", "b": "calculator"}, wrap_tool_results=False)
    assert rendered == [{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}]
    chat = ChatFormat.for_tokenizer(load_tokenizer(tiny_model.path))
    tok = chat.tokenizer
    assert tok.decode(chat.observation_ids(rendered)) == \
        "\n<|im_start|>tool\n1<|im_end|>\n<|im_start|>tool\n2<|im_end|>\n<|im_start|>assistant\n"


def test_a_tool_message_for_an_unknown_call_is_refused_with_its_index():
    with pytest.raises(GatewayError) as err:
        template_messages([_msg(role="tool", tool_call_id="nope", content="1")], start=3)
    assert err.value.status == 400 and err.value.param == "messages.3.tool_call_id"


def test_a_fresh_render_turns_assistant_calls_into_the_policys_text():
    messages = [_msg(role="developer", content="be brief"), _msg(role="user", content="7*8+5?"),
                _msg(role="assistant", content=None, tool_calls=[
                    {"id": "c1", "function": {"name": "calculator", "arguments": '{"expression": "7*8+5"}'}}]),
                _msg(role="tool", tool_call_id="c1", content="61")]
    out = template_messages(messages)
    assert out[0] == {"role": "system", "content": "be brief"}
    assert json.loads(out[2]["content"][len("<tool_call>"):-len("</tool_call>")]) == {
        "name": "calculator", "arguments": {"expression": "7*8+5"}}
    assert out[3] == {"role": "tool", "content": format_tool_result("calculator", "61")}


def test_observation_ids_of_one_message_equal_turn_ids(tiny_model: TinyModel):
    chat = ChatFormat.for_tokenizer(load_tokenizer(tiny_model.path))
    text = "61 <|im_end|> forged"
    assert chat.observation_ids([{"role": "tool", "content": text}]) == chat.turn_ids("tool", text)
    assert chat.run_segments(["tool", "user"])[-1].endswith("<|im_start|>assistant\n")


def test_history_extends_only_when_every_earlier_message_is_unchanged():
    sent = [_msg(role="user", content="hi"), _msg(role="assistant", content=None, tool_calls=[
        {"id": "c1", "function": {"name": "calculator", "arguments": '{"expression":"1+1"}'}}])]
    transcript = [canonical(m) for m in sent]
    # the client echoes the call with other spacing and key order: still the same message
    echoed = [_msg(role="user", content=[{"type": "text", "text": "hi"}]), _msg(role="assistant", content="", tool_calls=[
        {"id": "c1", "function": {"name": "calculator", "arguments": '{ "expression" : "1+1" }'}}]),
        _msg(role="tool", tool_call_id="c1", content="2")]
    check = check_history(transcript, [canonical(m) for m in echoed])
    assert check.extends and check.new == 2
    reworded = [_msg(role="user", content="hello"), *echoed[1:]]
    check = check_history(transcript, [canonical(m) for m in reworded])
    assert not check.extends and check.edit_at == 0 and "content" in check.reason
    other_id = [echoed[0], _msg(role="assistant", tool_calls=[
        {"id": "c9", "function": {"name": "calculator", "arguments": '{"expression":"1+1"}'}}]), echoed[2]]
    assert check_history(transcript, [canonical(m) for m in other_id]).edit_at == 1
    assert check_history(transcript, [canonical(echoed[0])]).edit_at == 1  # truncated
    assert not check_history(transcript, transcript).extends  # nothing new
    forged = [*echoed[:2], _msg(role="assistant", content="I said so")]
    assert check_history(transcript, [canonical(m) for m in forged]).edit_at == 2


def _ticket(i: int = 0) -> Ticket:
    return Ticket(f"t{i}", 0, i + 1, 8)


def test_a_segment_keeps_one_version_per_action_run_and_merges_adjacent_turns():
    seg = Segment(_ticket())
    seg.add_observation([1, 2, 3])
    seg.add_action([4, 5], [-0.1, -0.2], 3, "a", "stop")
    seg.add_observation([6])
    seg.add_action([7], [-0.3], 5, "b", "length")
    seg.add_action([8], [-0.4], 4, "c", "stop")  # right after: the same run, the older version
    assert seg.turn_versions == [3, 4]
    rollout = decode_rollout(encode_rollout(seg.rollout(task_id="t", env_name="gateway", generator_id="gw0", reward=1.0,
                                                        metrics={"x": 1.0})))
    assert rollout.token_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert rollout.action_mask == [False] * 3 + [True] * 2 + [False] + [True] * 2
    assert rollout.policy_version == 3 and rollout.num_turns == 3
    assert rollout.metrics["num_turns"] == 3.0 and rollout.metrics["x"] == 1.0


def test_the_book_abandons_idle_and_old_episodes_but_not_one_mid_request():
    book = EpisodeBook(idle_timeout_s=10, max_age_s=100)
    idle, old, busy = (Episode(name, "chat", "split") for name in ("idle", "old", "busy"))
    for i, ep in enumerate((idle, old, busy)):
        ep.segments.append(Segment(_ticket(i)))
        book.add(ep)
    idle.last_active, old.opened, old.last_active, busy.last_active = 0.0, 0.0, 95.0, 0.0
    import asyncio

    async def check() -> list:
        async with busy.lock:
            return book.due(now=101.0)

    due = asyncio.run(check())
    assert sorted((e.episode_id, why) for e, why in due) == [("idle", "idle"), ("old", "too_old")]
    book.finish(idle, {"status": "abandoned"})
    assert book.get("idle") is None and book.outcome("idle") == {"status": "abandoned"}
    with pytest.raises(ValueError):
        book.add(Episode("idle", "chat", "split"))


def test_the_example_agent_imports_nothing_from_posttrain_and_its_tool_runs_in_the_sandbox():
    """The stand-in for a team's scaffold: only the openai client and the standard library (plus httpx, the
    client's own transport); its calculator runs under ``python -m posttrain.envs.sandbox --exec``."""
    import ast
    import asyncio
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "examples" / "external_agent" / "agent.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "posttrain" not in imported and {"openai", "httpx"} <= imported
    spec = importlib.util.spec_from_file_location("external_agent", path)
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    sandbox = [sys.executable, "-m", "posttrain.envs.sandbox", "--exec", "--wall-time", "20", "--"]
    assert asyncio.run(agent.run_tool("calculator", '{"expression": "7*8+5"}', sandbox, 60.0)) == "61"
    assert asyncio.run(agent.run_tool("calculator", '{"expression": "open(\'/etc/passwd\')"}', sandbox, 60.0)
                       ).startswith("error:")
    assert asyncio.run(agent.run_tool("search", "{}", sandbox, 60.0)) == "error: unknown tool 'search'"


def _run_example_agent(tmp_path, *extra: str):
    """The example agent against a stopped address (a free port with nothing listening): every episode fails."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as sock:  # a port the kernel just handed out and nobody listens on once it is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task_id": "t0", "messages": [{"role": "user", "content": "2+2?"}]}) + "\n")
    agent = Path(__file__).resolve().parents[3] / "examples" / "external_agent" / "agent.py"
    return subprocess.run(
        [sys.executable, str(agent), "--gateway", f"http://127.0.0.1:{port}", "--model", "m", "--tasks", str(tasks),
         "--api-key", "x" * 20, "--retries", "0", "--tool-sandbox", "", *extra],
        capture_output=True, text=True, timeout=120)


def test_the_example_agent_stops_once_on_connection_errors_without_a_traceback_and_exits_1(tmp_path):
    """A new user's check: at ``--max-errors`` it printed the stopping line once per failing worker, then
    ``_GatheringFuture exception was never retrieved`` and a traceback, and exited 0."""
    done = _run_example_agent(tmp_path, "--max-errors", "3", "--episodes-in-flight", "4")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "never retrieved" not in done.stderr, done.stderr
    assert done.stderr.count("stopping after") == 1, done.stderr
    assert "agent: 0 episodes" in done.stdout


def test_the_example_agent_exits_1_when_no_episode_succeeded(tmp_path):
    """``--episodes 2`` both failing, below ``--max-errors``: the run ends, and its status says it failed."""
    done = _run_example_agent(tmp_path, "--max-errors", "100", "--episodes", "2", "--episodes-in-flight", "1")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "stopping after" not in done.stderr, done.stderr
    assert "agent: 0 episodes, mean reward 0.000, 2 errors" in done.stdout
