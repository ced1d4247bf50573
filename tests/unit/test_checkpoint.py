"""Checkpoints verified on load: a damaged one (cut short, a byte changed, its manifest missing) is
refused with its path and what is wrong, the newest intact one is taken instead, and saving after such a
resume prunes the abandoned newer files instead of the checkpoints the run still needs."""

from __future__ import annotations

import pytest

from largebatch_trainer import checkpoint


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
