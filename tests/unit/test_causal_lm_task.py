"""Token files and the causal_lm task, in one process: the windows a file gives, the held-out split, the
models task.args name, the loss's handling of padding, and every refusal with the field and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from largebatch import jobfile
from largebatch.errors import DataError, JobError, TaskError
from largebatch_trainer.tasks import load_task
from largebatch_trainer.token_files import TokenMeta, TokenWindows, meta_path, read_meta

ENTRYPOINT = "largebatch_trainer.tasks:causal_lm"
GPT2 = {"n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 32, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "attn_pdrop": 0.0}  # fmt: skip


def token_file(tmp_path, tokens: np.ndarray, vocab: int = 100, name: str = "train.bin", **meta) -> str:
    path = tmp_path / name
    tokens.astype(np.uint16).tofile(path)
    TokenMeta("uint16", vocab, **({"separator": 0, "tokens": len(tokens)} | meta)).write(path)
    return str(path)


def task(tmp_path, **args):
    defaults = {"modelType": "gpt2", "config": GPT2, "data": token_file(tmp_path, np.arange(1000) % 100)}
    return load_task(ENTRYPOINT, defaults | args, seed=0)


def test_windows_are_consecutive_slices_of_context_plus_one_tokens(tmp_path):
    path = token_file(tmp_path, np.arange(1000) % 100)
    windows = TokenWindows(Path(path), read_meta(Path(path), "data"), 10)
    assert len(windows) == 99  # (1000 - 1) // 10
    assert windows[0].tolist() == list(range(11)) and windows[1].tolist() == list(range(10, 21))
    assert windows[0].dtype == torch.long


def test_the_held_out_windows_are_the_last_fraction_and_training_never_reads_them(tmp_path):
    built = task(tmp_path, context=10, evalFraction=0.1)
    assert len(built.dataset) == 90 and len(built.eval_dataset) == 9
    assert built.eval_dataset[0].tolist() == built.dataset.tokens[900:911].tolist()
    assert task(tmp_path, context=10, evalFraction=0).eval_dataset is None
    separate = token_file(tmp_path, np.arange(200) % 100, name="val.bin")
    built = task(tmp_path, context=10, evalData=separate)
    assert len(built.dataset) == 99 and len(built.eval_dataset) == 19


def test_a_model_built_from_its_type_takes_vocabulary_and_special_ids_from_the_token_file(tmp_path):
    built = task(tmp_path, context=16)
    config = built.model.config
    assert (config.vocab_size, config.eos_token_id, config.bos_token_id) == (100, 0, 0)
    assert built.tokens_per_sample == 16 and built.model.training
    assert task(tmp_path).tokens_per_sample == 32  # the model's positions by default


def test_the_task_can_be_built_twice_in_one_process(tmp_path):
    """The entrypoint is a function of largebatch_trainer.tasks; its implementation's module must not take
    its name there once imported (the second build would call a module)."""
    first, second = task(tmp_path), task(tmp_path)
    assert first.model.state_dict().keys() == second.model.state_dict().keys()


def test_a_local_directory_with_weights_is_fine_tuned_from_them(tmp_path):
    built = task(tmp_path)
    with torch.no_grad():
        for p in built.model.parameters():
            p.add_(1.0)  # weights no fresh initialisation could give
    built.save_model(built.model, tmp_path / "pretrained")
    again = task(tmp_path, modelType=None, config={}, model=str(tmp_path / "pretrained"))
    for (name, p), q in zip(built.model.state_dict().items(), again.model.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    (tmp_path / "pretrained" / "model.safetensors").unlink()  # a config alone: random initialisation
    fresh = task(tmp_path, modelType=None, config={"n_layer": 2}, model=str(tmp_path / "pretrained"))
    assert fresh.model.config.n_layer == 2 and not torch.equal(
        fresh.model.state_dict()["lm_head.weight"], built.model.state_dict()["lm_head.weight"]
    )


def test_the_loss_is_each_windows_mean_over_targets_that_are_not_padding(tmp_path):
    tokens = np.arange(1000) % 100
    tokens[5:9] = 99  # padding inside the first window
    data = token_file(tmp_path, tokens, pad=99)
    built = load_task(ENTRYPOINT, {"modelType": "gpt2", "config": GPT2, "data": data, "context": 10}, seed=0)
    batch = torch.stack([built.dataset[0], built.dataset[1]])
    loss_sum, count = built.loss(built.model, batch)
    assert count == 2
    mask = (batch[:, :-1] != 99).long()
    logits = built.model(input_ids=batch[:, :-1], attention_mask=mask).logits
    per_token = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="none").view(2, 10)
    keep = batch[:, 1:] != 99
    expected = sum(per_token[i][keep[i]].mean() for i in range(2))
    assert int(keep[0].sum()) == 6 and int(keep[1].sum()) == 10
    torch.testing.assert_close(loss_sum, expected)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"modelType": None, "config": {}, "model": "openai-community/gpt2"}, ["not a directory", "hf download"]),
        ({"model": "/somewhere"}, ["exactly one of `model`"]),
        ({"modelType": None}, ["exactly one of `model`"]),
        ({"modelType": "gpt3"}, ["'gpt3' is not a model type"]),
        ({"modelType": "vit", "config": {}}, ["task.args.modelType 'vit'"]),
        ({"config": GPT2 | {"vocab_size": 50}}, ["vocabulary has 50 entries", "token file's 100"]),
        ({"context": 64}, ["task.args.context 64", "1 to 32 positions"]),
        ({"parametrization": "mup"}, ["parametrization 'mup'", "pylm"]),
        ({"evalFraction": 1.0}, ["evalFraction 1.0"]),
        ({"context": 10, "width": 64}, ["unexpected keyword argument 'width'"]),
    ],
)
def test_task_args_it_cannot_use_are_refused_with_the_field_and_the_fix(tmp_path, args, words):
    with pytest.raises(JobError) as refused:
        task(tmp_path, **args)
    assert all(word in str(refused.value) for word in words), str(refused.value)


def test_token_files_that_cannot_be_read_are_refused_with_the_fix(tmp_path):
    path = tmp_path / "train.bin"
    with pytest.raises(DataError, match="does not exist: make it with `lbctl prepare-data`"):
        read_meta(path, "task.args.data")
    np.arange(11, dtype=np.uint16).tofile(path)
    with pytest.raises(DataError, match='no train.bin.json beside it.*"dtype": "uint16"'):
        read_meta(path, "task.args.data")
    meta_path(path).write_text(json.dumps({"dtype": "int8", "vocabSize": 100}))
    with pytest.raises(DataError, match="dtype 'int8': use one of uint16, uint32"):
        read_meta(path, "task.args.data")
    TokenMeta("uint16", 100, tokens=12).write(path)
    with pytest.raises(DataError, match="22 bytes, not 12 tokens × 2 bytes: truncated, or still being written"):
        read_meta(path, "task.args.data")
    TokenMeta("uint16", 5).write(path)
    windows = TokenWindows(path, read_meta(path, "task.args.data"), 4)
    with pytest.raises(DataError, match="window 1 holds token 8, not below the vocabSize 5"):
        windows[1]
    evaluation = token_file(tmp_path, np.arange(100), vocab=200, name="val.bin")
    with pytest.raises(TaskError, match="the same tokenizer must make both"):
        task(tmp_path, evalData=evaluation)


def test_the_example_names_the_task_args_as_the_task_reads_them(tmp_path):
    """examples/hf-gpt2.yaml with its files made here and its model shrunk: the task builds from it."""
    example = jobfile.load(Path(__file__).parents[2] / "examples" / "hf-gpt2.yaml").spec.task
    args = dict(example.args)
    assert set(args) == {"modelType", "config", "data", "evalData", "context"}
    args |= {"data": token_file(tmp_path, np.arange(5000) % 100), "context": 16,
             "evalData": token_file(tmp_path, np.arange(500) % 100, name="val.bin"),
             "config": args["config"] | {"n_embd": 16, "n_layer": 1, "n_head": 2}}  # fmt: skip
    built = load_task(example.entrypoint, args, example.seed)
    assert built.model.config.n_positions == 1024 and built.model.config.resid_pdrop == 0.0
    assert len(built.eval_dataset) == 31


def test_the_hybrid_example_shards_the_models_own_decoder_layers(tmp_path):
    """examples/hf-llama-hybrid.yaml, its model shrunk: the units a sharded job wraps are the classes the
    model lists in `_no_split_modules` (as Hugging Face's FSDP integration reads them), one a layer."""
    example = jobfile.load(Path(__file__).parents[2] / "examples" / "hf-llama-hybrid.yaml").spec
    assert example.parallelism.data_parallel == "hybrid" and example.workers.devices_per_worker == 8
    small = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
             "num_key_value_heads": 1}  # fmt: skip
    args = dict(example.task.args)
    args |= {"data": token_file(tmp_path, np.arange(5000) % 100), "context": 16, "config": args["config"] | small,
             "evalData": token_file(tmp_path, np.arange(500) % 100, name="val.bin")}  # fmt: skip
    built = load_task(example.task.entrypoint, args, example.task.seed)
    units = built.shard_units(built.model)
    assert [type(unit).__name__ for unit in units] == ["LlamaDecoderLayer"] * 3
    assert set(built.model._no_split_modules) == {"LlamaDecoderLayer"}
