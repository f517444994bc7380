"""The single-process world, device resolution and the row shares of ``posttrain.parallel``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain.cli import main
from posttrain.parallel.shares import micro_batch_plan, rank_share
from posttrain.parallel.world import DeviceError, World, resolve_device


def test_one_process_world_collectives_are_the_identity() -> None:
    world = World()
    assert world.is_main and not world.distributed
    assert world.sum([1.5, 2]) == [1.5, 2.0] and world.max(3) == 3
    assert world.broadcast_bytes(b"abc") == b"abc" and world.all_gather_bytes(b"xy") == [b"xy"]
    with pytest.raises(ValueError, match="rank 0 must give a payload"):
        world.broadcast_bytes(None)


def test_rows_are_dealt_round_robin_and_fillers_pad_the_plan() -> None:
    order = [4, 0, 3, 1, 2]
    assert rank_share(order, World(rank=0, size=2)) == [4, 3, 2]
    assert rank_share(order, World(rank=1, size=2)) == [0, 1]
    plan = micro_batch_plan([0, 1, 2], 2, World(), filler=9)
    assert [(m.rows, m.counts) for m in plan] == [([0, 1], True), ([2], True)]
    empty = micro_batch_plan([], 2, World(), filler=9)
    assert [(m.rows, m.weight) for m in empty] == [([9], 0.0)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_cuda_asked_for_without_one_is_one_line_naming_the_field(tmp_path, capsys) -> None:
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(DeviceError, match="learner.device: 'cuda' asked for"):
        resolve_device("cuda")
    # Through the command: one line on stderr, exit status 2, before anything is read or written.
    config = Path(__file__).resolve().parents[3] / "configs" / "sao_demo_cpu.yaml"
    code = main(["learner", str(config), f"output_dir={tmp_path}", "learner.device=cuda"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("posttrain: learner.device: 'cuda' asked for")
    assert not any(tmp_path.iterdir())
