"""Checkpoints verified on load: a damaged one (cut short, a byte changed, its manifest missing) is
refused with its path and what is wrong, the newest intact one is taken instead, and saving after such a
resume prunes the abandoned newer files instead of the checkpoints the run still needs. The same for a
sharded job's checkpoints (directories of shards), beside a replicated job's files."""

from __future__ import annotations

import shutil

import pytest
import torch

from largebatch_trainer import checkpoint, sharded_checkpoint


def saved(directory, *steps, keep=10):
    return [checkpoint.save(directory, step, {"step": step}, keep=keep) for step in steps]


def test_an_intact_checkpoint_loads_as_written(tmp_path):
    (path,) = saved(tmp_path, 7)
    assert checkpoint.load(path) == {"step": 7}


def test_each_kind_of_damage_is_refused_with_the_file_and_the_fault(tmp_path):
    cut, flipped, orphan = saved(tmp_path, 1, 2, 3)
    cut.write_bytes(cut.read_bytes()[:-10])
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte changed
    flipped.write_bytes(bytes(data))
    checkpoint.manifest_for(orphan).unlink()
    for path, fault in ((cut, "(truncated)"), (flipped, "SHA-256 differs"), (orphan, "is missing")):
        with pytest.raises(checkpoint.CheckpointError) as error:
            checkpoint.load(path)
        assert str(path) in str(error.value) and fault in str(error.value)


def test_the_newest_intact_checkpoint_is_taken_and_each_damaged_one_named(tmp_path, capsys):
    _, middle, newest = saved(tmp_path, 10, 20, 30)
    newest.write_bytes(b"")
    found, payload = checkpoint.newest_intact(tmp_path)
    assert found == middle and payload == {"step": 20}
    assert f"skipping a damaged checkpoint: {newest}" in capsys.readouterr().err


def test_saving_after_a_resume_drops_the_abandoned_newer_files_not_the_kept_ones(tmp_path):
    saved(tmp_path, 10, 20, keep=2)
    (damaged,) = saved(tmp_path, 30, keep=3)
    damaged.write_bytes(b"")  # the run resumes from 20 and saves 25: 30 is from a history it left
    saved(tmp_path, 25, keep=2)
    assert [p.name for p in checkpoint.all_checkpoints(tmp_path)] == ["ckpt-0000000020.pt", "ckpt-0000000025.pt"]
    assert not checkpoint.manifest_for(damaged).exists()


# --- sharded checkpoints (largebatch_trainer.sharded_checkpoint), written by one process here -----------


def sharded(directory, step, keep=10):
    """A sharded checkpoint of a small model and its AdamW state, as a job of one rank writes it."""
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    final = checkpoint.path_for(directory, step, sharded=True)
    trainer = {"progress": {"step": step}}
    sharded_checkpoint.save_async(
        final, model, optimizer, trainer, None, lambda: checkpoint.prune(directory, final, keep)
    ).result()
    return final, model


def test_a_sharded_checkpoint_is_a_directory_of_verified_files_that_reads_whole(tmp_path):
    path, model = sharded(tmp_path, 4)
    assert path.name == "ckpt-0000000004.dcp" and checkpoint.is_sharded(path)
    assert sorted(p.name for p in path.iterdir()) == [".metadata", "__0_0.distcp", "__0_0.distcp.sha256"]
    payload = checkpoint.load(path)
    assert payload["progress"] == {"step": 4}
    torch.testing.assert_close(payload["model"], model.state_dict(), rtol=0, atol=0)
    assert set(payload["optimizer"]["state"]) == {"0.weight", "0.bias", "1.weight", "1.bias"}  # by name


def test_a_damaged_or_unfinished_sharded_checkpoint_is_passed_over_for_the_newest_intact_one(tmp_path, capsys):
    older = saved(tmp_path, 10)[0]  # a replicated job's, before the job was sharded
    middle, _ = sharded(tmp_path, 20)
    newest, _ = sharded(tmp_path, 30)
    shard = newest / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert "__0_0.distcp's SHA-256 differs" in sharded_checkpoint.verify(newest)
    partial = tmp_path / ".ckpt-0000000040.dcp.partial"  # a save cut short: never listed
    shutil.copytree(middle, partial)
    found, payload = checkpoint.newest_intact(tmp_path)
    assert found == middle and payload["progress"] == {"step": 20}
    assert f"skipping a damaged checkpoint: {newest}" in capsys.readouterr().err
    (middle / "__0_0.distcp").unlink()
    assert checkpoint.newest_intact(tmp_path)[0] == older
    sharded_checkpoint.remove_partials(tmp_path)
    assert not partial.exists()


def test_pruning_keeps_the_newest_of_either_format(tmp_path):
    saved(tmp_path, 10, 20)
    sharded(tmp_path, 30, keep=2)
    assert [p.name for p in checkpoint.all_checkpoints(tmp_path)] == ["ckpt-0000000020.pt", "ckpt-0000000030.dcp"]
