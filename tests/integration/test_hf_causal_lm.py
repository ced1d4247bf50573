"""The causal_lm task with real processes: a corpus tokenized by `lbctl prepare-data` with a tokenizer trained
here, tiny GPT-2 and Llama models (random init, no download) trained by `lbctl run --local`, the same
parameters at world sizes 1 and 3, the saved model loaded back by transformers with the trainer's logits,
and a token file larger than the memory the run may use."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
import torch

from largebatch_trainer import export
from largebatch_trainer.token_files import TokenMeta
from tests.helpers import bound
from tests.integration.hf_helpers import (
    SEESAW,
    VOCAB,
    assert_loads_with_the_trainers_logits,
    causal_lm_job,
    prepare_corpus,
)
from tests.integration.memory_limit import MemoryLimit
from tests.integration.trainer_helpers import (
    LBCTL,
    PYTHON,
    final_state,
    lbctl_run,
    params,
    relative_distance,
    run_standalone,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return prepare_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_a_tiny_model_trains_the_same_at_world_sizes_1_and_3_and_loads_back(tmp_path, corpus, model_type):
    job = causal_lm_job(tmp_path, "local", model_type, corpus)
    result = lbctl_run(job, tmp_path / "run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checkpoints = tmp_path / "run" / "checkpoints"
    state = final_state(checkpoints)
    assert state["progress"]["samples"] == 480
    step, samples, held_out, _ = state["evaluations"][-1]
    assert samples == 480 and held_out < math.log(VOCAB) - 0.5, "it learned next to nothing"

    # Three ranks with accumulation (8 = 3 + 3 + 2, micro-batches of 2) take the same steps.
    candidate = causal_lm_job(tmp_path, "three", model_type, corpus, batch={
        "initial": 8, "max": 24, "microBatchPerDevice": 2, "policy": SEESAW})  # fmt: skip
    run_standalone(candidate, 3)
    got = final_state(tmp_path / "three-ckpt")
    assert got["progress"]["samples"] == 480 and {run[3] for run in got["history"]} == {3}
    # The same to float rounding, measured over the whole model: 7e-8 (GPT-2) and 3e-6 (Llama). Summed in
    # another order (an embedding row's gradient adds up every occurrence of its token), the rounding
    # grows over 44 steps. A sample skipped, repeated or weighted wrong is an eighth of a step's gradient.
    assert relative_distance(params(got), params(state)) < 3e-5

    # The model written at the end is the trainer's final model, as transformers loads it.
    from transformers import AutoTokenizer

    saved = checkpoints / export.MODEL_DIR
    assert f"The trained model, in its own format: {saved}" in result.stdout
    assert (saved / "model.safetensors").is_file() and (saved / "tokenizer.json").is_file()
    assert_loads_with_the_trainers_logits(saved, job, params(state))
    tokenizer = AutoTokenizer.from_pretrained(saved, local_files_only=True)
    assert len(tokenizer) == VOCAB and tokenizer.eos_token == "<|endoftext|>"


def test_lbctl_export_writes_the_model_of_an_earlier_checkpoint(tmp_path, corpus):
    job = causal_lm_job(tmp_path, "export", "gpt2", corpus, checkpoint={"path": str(tmp_path / "ckpt"),
                                                                         "everySteps": 10, "keep": 100})  # fmt: skip
    run_standalone(job, 0)
    out = tmp_path / "step-10"
    result = subprocess.run([*LBCTL, "export", str(job), "--step", "10", "--out", str(out)],
                            capture_output=True, text=True, timeout=bound(300))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wrote the model of step 10" in result.stdout
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).state_dict()
    at_ten = final_state_of_step(tmp_path / "ckpt", 10)
    final = final_state(tmp_path / "ckpt")["model"]
    name = "transformer.h.0.attn.c_attn.weight"
    assert torch.equal(loaded[name], at_ten[name]) and not torch.equal(loaded[name], final[name])
    missing = subprocess.run([*LBCTL, "export", str(job), "--step", "7", "--out", str(tmp_path / "x")],
                             capture_output=True, text=True, timeout=bound(300))  # fmt: skip
    assert missing.returncode == 2 and "no checkpoint of step 7" in missing.stderr and not (tmp_path / "x").exists()


def final_state_of_step(directory: Path, step: int) -> dict:
    from largebatch_trainer import checkpoint

    return checkpoint.load(checkpoint.path_for(directory, step))["model"]


def test_a_token_file_larger_than_the_memory_limit_trains_without_loading_it(tmp_path):
    """6 GiB of tokens (a sparse file: zeros, no disk) under a 2 GiB memory limit on every process of the run.
    Reading the file into memory in that limit is killed, which shows that the limit holds."""
    data = tmp_path / "huge.bin"
    with data.open("wb") as handle:
        handle.truncate(6 << 30)
    TokenMeta("uint16", VOCAB, separator=0, tokens=3 << 30).write(data)
    job = causal_lm_job(tmp_path, "huge", "gpt2", data, schedule={"totalSamples": 96, "warmupSamples": 8})
    with MemoryLimit(tmp_path.name, 2 << 30) as limit:
        loading = subprocess.run(
            limit.command([PYTHON, "-c", f"import numpy; numpy.fromfile({str(data)!r}, numpy.uint16).sum()"]),
            capture_output=True, text=True, timeout=bound(300),
        )  # fmt: skip
        assert loading.returncode == -9, f"the limit did not stop a process that loads the file: {loading}"
        result = lbctl_run(job, tmp_path / "run", wrap=limit.command)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    state = final_state(tmp_path / "run" / "checkpoints")
    assert state["progress"]["samples"] == 96 and math.isfinite(state["evaluations"][-1][2])
