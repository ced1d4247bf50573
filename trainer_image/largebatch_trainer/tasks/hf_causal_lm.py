"""A Hugging Face causal language model (`transformers`, the `largebatch[hf]` extra) on a token file.

`task.args`:
- the model, one of: `model`, a local directory holding a `config.json` (and weights, which training
  starts from: fine-tuning; without them the model is initialised at random), or `modelType` (`gpt2`,
  `llama`, any type `transformers.AutoConfig` knows) built at random. `config` sets config fields over
  either (`{n_embd: 768, n_layer: 12}`, `{hidden_size: 512, num_hidden_layers: 8}`). A model built from
  `modelType` takes its `vocab_size`, and its `bos`, `eos` and `pad` token ids, from the token file
  unless `config` sets them. Nothing is downloaded: a hub id (`openai-community/gpt2`) is refused with
  the way to mount it;
- `data`: the token file (`largebatch_trainer.token_files`), `context`: tokens per sample (default: the
  model's `max_position_embeddings`, at most 1024);
- the held-out windows: `evalData`, a second token file, or else the last `evalFraction` of `data`'s
  windows (default 0.01, at least one window; 0 holds nothing out), which training then never reads.

The loss is each window's mean next-token cross-entropy (over its targets that are not padding: the
token file's `pad` id, if it names one), summed over the batch as the trainer's contract asks. The model
is written at the end of training with `save_pretrained` (safetensors), with the tokenizer the token
file names when that directory is there, so that `AutoModelForCausalLM.from_pretrained` loads it.

Dropout draws from each rank's random stream, so a model with dropout trains the same in distribution
but not bit for bit at another world size; the configs of the exactness tests set it to 0, as large-batch
pretraining usually does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from largebatch.errors import TaskError
from largebatch_trainer.tasks import Task, blocks_of_classes
from largebatch_trainer.token_files import TokenMeta, TokenWindows, read_meta

IGNORE = -100
"""The label transformers and torch's cross-entropy skip."""
MAX_DEFAULT_CONTEXT = 1024
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")  # fmt: skip


def _transformers():
    try:
        import transformers
    except ImportError:
        raise TaskError("the causal_lm task needs transformers: install largebatch[hf]") from None
    transformers.logging.set_verbosity_error()  # its notices about configs would repeat on every rank
    transformers.utils.logging.disable_progress_bar()
    return transformers


def build_model(model: str | None, model_type: str | None, config: dict[str, Any], meta: TokenMeta) -> torch.nn.Module:
    """The model `task.args` name, in float32 (the trainer's master weights), in training mode."""
    transformers = _transformers()
    if (model is None) == (model_type is None):
        raise TaskError("task.args: name the model with exactly one of `model` (a local directory with config.json) "
                        "or `modelType` (e.g. gpt2, llama, built at random)")  # fmt: skip
    if model is not None:
        directory = Path(model)
        if not directory.is_dir():
            raise TaskError(
                f"task.args.model {model!r} is not a directory here: the trainer downloads nothing. If it is a hub "
                f"id, fetch it beforehand (`hf download {model} --local-dir DIR`), put DIR on a volume the job "
                "mounts and name that path"
            )
        if not (directory / "config.json").is_file():
            raise TaskError(f"task.args.model {model!r} has no config.json: it must be a save_pretrained directory")
        cfg = transformers.AutoConfig.from_pretrained(directory, local_files_only=True, **config)
        if any((directory / name).is_file() for name in WEIGHT_FILES):
            loaded = transformers.AutoModelForCausalLM.from_pretrained(directory, config=cfg, local_files_only=True)
        else:
            loaded = transformers.AutoModelForCausalLM.from_config(cfg)
    else:
        known = transformers.CONFIG_MAPPING
        if model_type not in known:
            raise TaskError(f"task.args.modelType {model_type!r} is not a model type transformers knows "
                            "(gpt2, llama, mistral, qwen2, ...)")  # fmt: skip
        defaults = {"vocab_size": meta.vocabSize}
        for field in ("bos_token_id", "eos_token_id"):
            defaults[field] = meta.separator
        defaults["pad_token_id"] = meta.pad
        cfg = transformers.AutoConfig.for_model(model_type, **(defaults | config))
        try:
            loaded = transformers.AutoModelForCausalLM.from_config(cfg)
        except ValueError as exc:  # a type without a causal-LM head (bert, t5, ...)
            raise TaskError(f"task.args.modelType {model_type!r}: {exc}") from None
    vocab = loaded.get_input_embeddings().num_embeddings
    if vocab < meta.vocabSize:
        raise TaskError(f"the model's vocabulary has {vocab} entries and the token file's {meta.vocabSize}: its ids "
                        "would index past the embedding. Use the tokenizer the model was trained with, or set "
                        "config.vocab_size")  # fmt: skip
    return loaded.float().train()


def build(
    data: str,
    model: str | None = None,
    modelType: str | None = None,  # spelt as task.args spells them in the job file
    config: dict[str, Any] | None = None,
    context: int | None = None,
    evalData: str | None = None,
    evalFraction: float = 0.01,
    parametrization: str = "standard",
) -> Task:
    if parametrization != "standard":
        raise TaskError(
            f"task.args.parametrization {parametrization!r}: the causal_lm task trains transformers' models as "
            "they are, in their standard parametrization. μP needs the attention scaled by 1/d_head and a "
            "readout scaled by the width, inside the model's forward, which transformers' GPT-2 and Llama do "
            'not expose (docs/trainer.md, "Your model and your data"); use the pylm task for μP'
        )
    if not 0 <= evalFraction < 1:
        raise TaskError(f"task.args.evalFraction {evalFraction}: a fraction of the windows, from 0 up to below 1")
    meta = read_meta(Path(data), "task.args.data")
    module = build_model(model, modelType, config or {}, meta)
    positions = getattr(module.config, "max_position_embeddings", None) or MAX_DEFAULT_CONTEXT
    context = context or min(positions, MAX_DEFAULT_CONTEXT)
    if not 1 <= context <= positions:
        raise TaskError(f"task.args.context {context}: the model takes 1 to {positions} positions "
                        "(config max_position_embeddings)")  # fmt: skip
    train_path = Path(data)
    total = len(TokenWindows(train_path, meta, context))
    if evalData is not None:
        eval_path = Path(evalData)
        eval_meta = read_meta(eval_path, "task.args.evalData")
        if (eval_meta.dtype, eval_meta.vocabSize) != (meta.dtype, meta.vocabSize):
            raise TaskError(f"task.args.evalData {evalData} holds {eval_meta.dtype} ids of a {eval_meta.vocabSize}-"
                            f"token vocabulary, task.args.data {meta.dtype} of {meta.vocabSize}: "
                            "the same tokenizer must make both")  # fmt: skip
        train, held_out = TokenWindows(train_path, meta, context), TokenWindows(eval_path, eval_meta, context)
    else:
        kept = max(1, int(total * evalFraction)) if evalFraction and total > 1 else 0
        train = TokenWindows(train_path, meta, context, 0, total - kept)
        held_out = TokenWindows(train_path, meta, context, total - kept, total) if kept else None
    if len(train) == 0:
        raise TaskError(f"task.args.data {data} holds {total} windows of {context + 1} tokens, none left to train "
                        "on: use a smaller context or a larger file")  # fmt: skip
    return Task(
        model=module,
        dataset=train,
        loss=_loss(meta.pad),
        eval_dataset=held_out if held_out is not None and len(held_out) else None,
        tokens_per_sample=context,
        save_model=lambda trained, out: save(trained, out, meta),
        # The decoder layers, as the model names them for Hugging Face's own FSDP wrapping.
        shard_units=blocks_of_classes(*(getattr(module, "_no_split_modules", None) or ())),
    )


def _loss(pad: int | None):
    def loss(model: torch.nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
        inputs, labels = batch[:, :-1], batch[:, 1:]
        mask = None
        if pad is not None:
            labels = labels.masked_fill(labels == pad, IGNORE)
            mask = (inputs != pad).long()
        logits = model(input_ids=inputs, attention_mask=mask, use_cache=False).logits
        per_token = F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="none"
        ).view_as(labels)
        counted = (labels != IGNORE).sum(dim=1).clamp(min=1)  # a window of padding alone adds 0
        return (per_token.sum(dim=1) / counted).sum(), len(batch)

    return loss


def save(model: torch.nn.Module, out: Path, meta: TokenMeta) -> None:
    """`save_pretrained` (safetensors) into `out`, with the token file's tokenizer when it is here."""
    transformers = _transformers()
    model.save_pretrained(out)
    if meta.tokenizer and Path(meta.tokenizer, "tokenizer_config.json").is_file():
        transformers.AutoTokenizer.from_pretrained(meta.tokenizer, local_files_only=True).save_pretrained(out)
