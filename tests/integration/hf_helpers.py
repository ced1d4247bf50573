"""Helpers for the Hugging Face tests: a tokenizer trained here from text (no download) and the text, the
token file made from them, and causal_lm jobs of tiny GPT-2 and Llama models."""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

from tests.helpers import bound
from tests.integration.trainer_helpers import LBCTL, write_job

SEPARATOR = "<|endoftext|>"


def texts(count: int) -> list[Path]:
    """`count` source files of the standard library: text every Python installation has."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(root.glob("*.py"))[:count]


def make_tokenizer(directory: Path, vocab: int = 512) -> Path:
    """A byte-level BPE tokenizer of `vocab` ids trained on a few standard-library files (a second or two),
    saved as transformers saves one, with the separator as its end-of-text token."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(
        (path.read_text(errors="replace") for path in texts(20)), vocab_size=vocab, special_tokens=[SEPARATOR]
    )
    wrapped = PreTrainedTokenizerFast(tokenizer_object=trained._tokenizer, eos_token=SEPARATOR)
    wrapped.save_pretrained(directory)
    return directory


VOCAB = 512
NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
MODELS = {
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64} | NO_DROPOUT,
    "llama": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64},
}  # fmt: skip
# Not capped at the critical batch: the noise scale is measured differently at each world size, so a cap
# would make the two runs' batches, not only their float rounding, differ.
SEESAW = {"type": "seesaw", "seesaw": {"capAtCriticalBatch": False}}


def prepare_corpus(directory: Path) -> Path:
    """A token file of the standard library's first 40 modules in `directory`, made as a user makes one."""
    tokenizer = make_tokenizer(directory / "tokenizer", VOCAB)
    out = directory / "train.bin"
    command = [*LBCTL, "prepare-data", *map(str, texts(40)), "--tokenizer", str(tokenizer), "--out", str(out),
               "--workers", "2"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=bound(300))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tokens in 40 documents" in result.stdout
    return out


def causal_lm_job(tmp_path: Path, name: str, model_type: str, data: Path, **spec) -> Path:
    task = {
        "entrypoint": "largebatch_trainer.tasks:causal_lm",
        "args": {"modelType": model_type, "config": MODELS[model_type], "data": str(data), "context": 32},
    }
    settings = {
        "batch": {"initial": 8, "max": 24, "microBatchPerDevice": 4, "policy": SEESAW},
        # SGD: Adam's update has the size of the LR even where the gradient is float noise (GPT-2's key bias,
        # to which softmax is blind), which would make runs at two world sizes differ by the LR, not by eps.
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
        "schedule": {"totalSamples": 480, "warmupSamples": 48},
        "evaluation": {"everySamples": 480, "samples": 32},
    }
    return write_job(tmp_path, name, task=task, **(settings | spec))


def assert_loads_with_the_trainers_logits(saved: Path, job: Path, model_state: dict):
    """The model directory `saved` loads in transformers and gives, on a held-out window, the logits of the
    job's model holding `model_state` (a checkpoint's): the model written is the one trained. Returns it."""
    import torch
    from transformers import AutoModelForCausalLM

    from largebatch_trainer.tasks import load_task
    from tests.integration.trainer_helpers import spec_of

    loaded = AutoModelForCausalLM.from_pretrained(saved, local_files_only=True)
    spec = spec_of(job)
    task = load_task(spec.task.entrypoint, spec.task.args, spec.task.seed)
    task.model.load_state_dict(model_state)
    task.model.eval()
    window = task.eval_dataset[0][None, :-1]
    with torch.no_grad():
        torch.testing.assert_close(loaded(window).logits, task.model(window).logits, rtol=0, atol=0)
    return loaded
