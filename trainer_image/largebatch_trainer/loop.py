"""The training loop: one optimizer step at a time, exactly as `largebatch.schedule` plans it.

Each step (`Trainer._step`): plan the batch and LR from the exact progress, split the batch over ranks
and micro-batches, run the micro-steps with the loss divided by the global batch (`_micro_steps`;
gradients are summed, never averaged, so any world size, uneven split or accumulation gives the
full-batch gradient), all-reduce the step's statistics in one collective while the optimizer steps
(`StepStats`: the loss, the noise scale's small-batch sums, the stop flag, the samples run), update the
gradient noise scale (`_update_noise`), advance the progress. A NaN or infinite loss stops every rank
with `largebatch.errors.DivergenceError`. Checkpoints on a cadence, on SIGTERM/SIGINT and at the end,
gathered from the parts that own their state (`largebatch_trainer.stateful`); the newest intact one is
loaded on every start, whichever mode and world size wrote it. The ranks hold the model whole, under DDP
(`parallelism.dataParallel: replicate`; rank 0 writes each checkpoint), or sharded
(`largebatch_trainer.sharding`; every rank writes its shard in the background,
`largebatch_trainer.sharded_checkpoint`). At the end, a task with a model format of its own writes the
model in it (`export`).
The precision, the all-reduce dtype and torch.compile are `largebatch_trainer.accelerator`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from largebatch import launch, report, schedule
from largebatch.api import LargeBatchJob, PlanStatus
from largebatch.errors import DivergenceError, SetupError
from largebatch_trainer import (
    accelerator,
    checkpoint,
    evaluation,
    export,
    noise,
    optim,
    reporting,
    sharded_checkpoint,
    sharding,
    stateful,
)
from largebatch_trainer.data import SampleStream, to_device
from largebatch_trainer.distributed import DistEnv, choose_device, init_process_group, restarts_of_any_agent
from largebatch_trainer.metrics import Metrics
from largebatch_trainer.progress import Sink
from largebatch_trainer.reduction import StepStats, data_parallel
from largebatch_trainer.tasks import Task, load_task


@dataclass
class Options:
    checkpoint_dir: Path
    device: str = "auto"
    metrics_port: int | None = None
    sink: Sink | None = None
    report_seconds: float = 2.0
    log_seconds: float = 10.0  # how often rank 0 prints a progress line (what `kubectl logs` of a worker shows)


class Trainer:
    def __init__(self, job: LargeBatchJob, options: Options):
        self.job, self.spec, self.options = job, job.spec, options
        self.env = DistEnv.from_environ()
        self.device = choose_device(self.spec.workers.accelerator, options.device, self.env.local_rank)
        self.precision = accelerator.precision_on(self.spec, self.device)
        accelerator.configure(self.device, self.precision)
        init_process_group(self.env, self.device, self.spec.workers.collective_timeout_seconds)
        self.task: Task = load_task(self.spec.task.entrypoint, self.spec.task.args, self.spec.task.seed)
        self.module = self.task.model.to(self.device)
        # Sharded: the module in place under fully_shard, before the optimizer takes its (sharded) parameters.
        self.sharded = self.spec.parallelism.data_parallel != "replicate"
        self.scatter, self.replicas = None, 1
        if self.sharded and self.env.world_size > 1:
            mesh = sharding.device_mesh(self.spec.parallelism.data_parallel, self.env, self.device)
            self.scatter = sharding.shard(
                self.module, self.task, mesh, self.precision, self.spec.gradient_all_reduce, self.spec.task.compile
            )
            self.replicas = sharding.replicas(mesh)
        self.optimizer = optim.build(self.spec.optimizer, self.module, fused=self.device.type == "cuda")
        self.saving = None  # the sharded checkpoint being written in the background
        self.checkpoint_group = sharding.checkpoint_group() if self.sharded else None
        self.noise = noise.NoiseScale(self.spec.batch.policy.critical_batch.smoothing)
        self.estimator = self.spec.batch.policy.critical_batch.estimator
        self.evaluations = stateful.Evaluations()
        self.stream = SampleStream(len(self.task.dataset), self.spec.task.seed)
        self.progress = schedule.Progress()
        self.history = stateful.History()
        self.stop = _StopFlag()
        self.plan_status = PlanStatus()
        self.last_loss: float | None = None
        self._resume()
        self.model = self.module
        self.hook = None
        if self.env.world_size > 1 and self.scatter is None:
            self.model, self.hook = data_parallel(self.module, self.device, self.spec.gradient_all_reduce)
        if self.spec.task.compile and self.scatter is None:
            # In place, so that the state dict keeps its keys; DDP compiled whole, so that Dynamo splits
            # the graph at DDP's buckets and their all-reduce still overlaps the backward pass.
            self.model.compile()
        self.metrics = Metrics(
            self.job.metadata.namespace or "default", self.job.metadata.name, self.env.rank, options.metrics_port
        )
        self.metrics.total.set(self.spec.schedule.total_samples)
        self.restarts = restarts_of_any_agent(self.env.restart_count, self.device)
        self.metrics.restarts.set(self.restarts)
        if self.evaluations.latest and self.env.rank == 0:  # the latest evaluation before this start, as it was
            self.metrics.evaluation(*self.evaluations.latest[2:])
        self.throughput: float | None = None
        self._last_report = self._last_log = 0.0

    # --- state ------------------------------------------------------------------------------------

    def _parts(self) -> dict[str, stateful.Stateful]:
        """What a checkpoint holds, each part saving and loading its own state (largebatch_trainer.stateful),
        in the order they are written and loaded."""
        return {
            "model": self.module,
            "optimizer": self.optimizer,
            "progress": stateful.Attribute(
                self, "progress", dataclasses.asdict, lambda saved: schedule.Progress(**saved)
            ),
            "noise": self.noise,
            "history": self.history,
            "evaluations": self.evaluations,
            "rng": stateful.TorchRNG(),
            # What the last step reported, so that a worker restarted after the end still reports it.
            "loss": stateful.Attribute(self, "last_loss", optional=True),
            "plan": stateful.Attribute(self, "plan_status", _dump_plan, _load_plan, optional=True),
        }

    def _parts_besides_tensors(self) -> dict[str, stateful.Stateful]:
        """The parts other than the model and the optimizer: what a sharded checkpoint holds as one blob, and
        what loads apart from the tensors when the tensors load shard by shard."""
        return {key: part for key, part in self._parts().items() if key not in ("model", "optimizer")}

    def _resume(self) -> None:
        """Load the newest intact checkpoint. Rank 0 lists them and every rank takes the same one: ranks must
        never train from different steps (another writer, or a file that went bad, could make them choose
        apart)."""
        directory = self.options.checkpoint_dir
        names: list = [[]]
        if self.env.rank == 0:
            sharded_checkpoint.remove_partials(directory)
            names[0] = [path.name for path in reversed(checkpoint.all_checkpoints(directory))]
        if self.env.world_size > 1:
            dist.broadcast_object_list(names, src=0)
        for name in names[0]:
            path = directory / name
            payload = self._intact(path)
            if payload is None:
                continue
            self._load(path, payload)
            if self.env.rank == 0:
                print(f"resumed from checkpoint {name} at step {self.progress.step} (samples "
                      f"{self.progress.samples}) with world size {self.env.world_size}", flush=True)  # fmt: skip
            return

    def _intact(self, path: Path) -> dict | None:
        """The checkpoint's payload as far as this rank has read it ({} for a sharded one, which loads into
        the model), or None when a rank found it damaged (that rank names it on stderr)."""
        payload, problem = {}, None
        if checkpoint.is_sharded(path):  # every rank verifies its share of the files
            problem = sharded_checkpoint.verify(path, self.env.rank, self.env.world_size)
        elif self.env.rank == 0:
            try:
                payload = checkpoint.load(path)
            except checkpoint.CheckpointError as exc:
                problem = str(exc)
        if problem:
            print(f"warning: skipping a damaged checkpoint: {problem}", file=sys.stderr, flush=True)
        damaged = problem is not None
        if self.env.world_size > 1:
            flag = torch.tensor([int(damaged)], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            damaged = bool(flag.item())
        return None if damaged else payload

    def _load(self, path: Path, payload: dict) -> None:
        rest = self._parts_besides_tensors()
        if checkpoint.is_sharded(path):
            saved = sharded_checkpoint.read_trainer(path)
            self._check_optimizer_layout(saved["optimizer_layout"], path)
            sharded_checkpoint.load(path, self.module, self.optimizer)
            stateful.scatter(rest, saved)
            return
        if not payload:
            payload = checkpoint.load(path)
        self._check_optimizer_layout(optim.layout(payload["optimizer"]["param_groups"]), path)
        if self.scatter is None:
            stateful.scatter(self._parts(), payload)
        else:  # a replicated job's checkpoint, each rank taking its shard of the whole tensors
            sharded_checkpoint.load_whole(self.module, self.optimizer, payload["model"], payload["optimizer"])
            stateful.scatter(rest, payload)

    def _check_optimizer_layout(self, saved: list, path: Path) -> None:
        """Refuse a checkpoint whose optimizer groups are not this model's: loading it would pair the saved
        moments with other parameters, or fail deep inside torch."""
        saved, ours = [tuple(group) for group in saved], optim.layout(self.optimizer.param_groups)
        if saved != ours:
            raise SetupError(
                f"checkpoint {path} holds optimizer groups {saved} (parameters, "
                f"μP LR scale) and this job's model has {ours}: task.args (parametrization, baseWidth or the "
                "model's shape) changed since it was written. Resume with the task.args it was written with, "
                "or set checkpoint.path to a new directory to start afresh"
            )

    def _save(self) -> None:
        if self.sharded:
            self._save_shards()
            return
        if self.env.rank != 0:
            return
        started = time.perf_counter()
        payload = stateful.gather(self._parts())
        checkpoint.save(self.options.checkpoint_dir, self.progress.step, payload, self.spec.checkpoint.keep)
        self._write_record(started)

    def _save_shards(self) -> None:
        """Every rank starts writing its shard and goes on training; the one save before it is waited for
        first. Training stands still while the state is copied off the training tensors."""
        started = time.perf_counter()
        self.wait_for_save()
        directory, keep = self.options.checkpoint_dir, self.spec.checkpoint.keep
        final = checkpoint.path_for(directory, self.progress.step, sharded=True)
        trainer = None
        if self.env.rank == 0:  # written once: rank 0's RNG, as a replicated job's checkpoint holds
            trainer = stateful.gather(self._parts_besides_tensors())
            trainer["optimizer_layout"] = optim.layout(self.optimizer.param_groups)
        self.saving = sharded_checkpoint.save_async(
            final, self.module, self.optimizer, trainer, self.checkpoint_group,
            lambda: checkpoint.prune(directory, final, keep),
        )  # fmt: skip
        if self.env.rank == 0:
            self._write_record(started)

    def wait_for_save(self) -> None:
        """Wait for the checkpoint being written in the background (its errors are raised here)."""
        if self.saving is not None:
            saving, self.saving = self.saving, None
            saving.result()

    def _write_record(self, started: float) -> None:
        record = report.TrainingRecord(
            step=self.progress.step,
            samples=self.progress.samples,
            loss=report.finite(self.last_loss),
            history=self.history.spans(),
            evaluations=self.evaluations.typed(),
        )
        report.write_record(self.options.checkpoint_dir, record)
        self.metrics.checkpoint_seconds.set(time.perf_counter() - started)

    # --- the loop ---------------------------------------------------------------------------------

    def run(self) -> bool:
        """Train until the data budget is spent (True) or a stop is requested (False)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.stop.set)
        total = self.spec.schedule.total_samples
        every = self.spec.checkpoint.every_steps
        while self.progress.samples < total:
            stop = self._step()
            self._evaluate_when_due()
            if stop or self.progress.step % every == 0 or self.progress.samples >= total:
                self._save()
            if stop:
                self.wait_for_save()  # a SIGTERM's last checkpoint is written before the worker exits
                self._report(force=True)
                print(f"rank {self.env.rank}: stopped after step {self.progress.step}", file=sys.stderr, flush=True)
                return False
        self.wait_for_save()
        self._export_model()
        return True

    def _export_model(self) -> None:
        """The trained model in its own format, for a task that has one, beside the checkpoints. A sharded
        model is gathered whole on rank 0 first, in CPU memory."""
        if self.task.save_model is None:
            return
        out = self.options.checkpoint_dir / export.MODEL_DIR
        if self.scatter is not None:
            whole = sharded_checkpoint.whole_model_state(self.module)  # every rank takes part
            if self.env.rank == 0:
                fresh = load_task(self.spec.task.entrypoint, self.spec.task.args, self.spec.task.seed)
                export.write_state(fresh, whole, out)
                print(f"wrote the trained model (step {self.progress.step}) to {out}", flush=True)
            return
        if self.env.rank != 0:
            return
        out = export.write(self.task, self.module, out)
        print(f"wrote the trained model (step {self.progress.step}) to {out}", flush=True)

    def _step(self) -> bool:
        """One optimizer step: plan it, run this rank's micro-steps, all-reduce the step's statistics while
        the optimizer steps, then update the noise scale and the progress. True when a rank was asked to
        stop (every rank sees the same sum, so all stop after this step)."""
        started = time.perf_counter()
        spec, world = self.spec, self.env.world_size
        plan = schedule.plan(spec, self.progress)
        batch = plan.global_batch
        split = schedule.split(batch, world, spec.batch.micro_batch_per_device, spec.batch.bn_batch)
        micro = self._micro_batches(split)
        weights, measure = self._measuring(micro)
        for norms in (self.hook, self.scatter):
            if norms is not None:
                norms.reset(weights)
        params = [p for p in self.module.parameters() if p.requires_grad]
        position = self.progress.samples + split.rank_offset(self.env.rank)
        loss_sum, micro_norms = self._micro_steps(micro, position, batch, params, weights)
        packed = self._statistics(loss_sum, micro, micro_norms, batch, measure, params).pack(self.device)
        # The all-reduce overlaps the optimizer step; nothing below needs it until after the step.
        pending = dist.all_reduce(packed, async_op=True) if world > 1 else None
        global_sq = self._global_sq(micro_norms, params, weights)
        if spec.optimizer.max_grad_norm:  # after the noise scale's norms: it measures the gradient as computed
            optim.clip_gradients(params, spec.optimizer.max_grad_norm)
        # Here, not before the backward: the preconditioned estimator has read the moments as they stand.
        optim.set_lr(self.optimizer, plan.lr, plan.betas, plan.eps)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if pending is not None:
            pending.wait()
        totals = StepStats.unpack(packed)
        if not math.isfinite(totals.loss_sum):  # every rank sees the same all-reduced loss, so all stop here
            raise DivergenceError(
                f"{launch.DIVERGED}: the loss of step {self.progress.step + 1} is {totals.loss_sum / batch} (lr "
                f"{plan.lr:.4g}, global batch {batch}): lower optimizer.lr or lengthen schedule.warmupSamples"
            )
        self._update_noise(totals, batch, global_sq)
        self._advance(plan, split, started, totals)
        return bool(totals.stop)

    def _micro_batches(self, split: schedule.Split) -> tuple[int, ...]:
        """This rank's micro-batch sizes, a lone one cut in two halves on a step that measures by halves."""
        micro = split.micro_batches[self.env.rank]
        # Never with bnBatch: a BN batch split in two would normalise over other samples.
        if (
            self.env.world_size == 1
            and len(micro) == 1
            and micro[0] >= 2
            and not self.spec.batch.bn_batch
            and self._measure_by_halves()
        ):
            micro = (micro[0] - micro[0] // 2, micro[0] // 2)
        return micro

    def _measuring(self, micro: tuple[int, ...]) -> tuple[dict[int, torch.Tensor] | None, bool]:
        """The preconditioner weights of the noise-scale norms (None for the simple estimator), and whether
        this step measures the noise scale at all."""
        # Two small batches or more (ranks or micro-batches) measure the noise scale. The preconditioned
        # estimator needs the optimizer's second moments: none before the first step.
        measure = self.env.world_size > 1 or len(micro) > 1
        weights = None
        if measure and self.estimator == "preconditioned":
            weights = (
                noise.preconditioners(self.optimizer)
                if self.scatter is None
                else sharding.local_preconditioners(self.optimizer)
            )
        return weights, measure and (weights is not None or self.estimator == "simple")

    def _micro_steps(
        self,
        micro: tuple[int, ...],
        position: int,
        batch: int,
        params: list[torch.Tensor],
        weights: dict[int, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, list[tuple[int, torch.Tensor]]]:
        """Forward and backward over this rank's micro-batches from stream position `position`, each loss
        divided by the global `batch`, the gradients accumulated in `.grad` (DDP all-reduces them on the
        last one, FSDP reduce-scatters each). Returns the rank's loss sum and, for a single worker with
        several micro-batches or a sharded model, each one's (samples, |G_micro|² at the global batch's
        scale)."""
        world = self.env.world_size
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        micro_norms: list[tuple[int, torch.Tensor]] = []
        # Empty micro-steps are skipped: the rank's gradients travel with its last real micro-step. A rank
        # with no samples at all still joins DDP's all-reduce with one micro-step on one sample weighted
        # zero, in eval mode: BatchNorm then uses its running statistics instead of normalising over a
        # batch of one (BatchNorm1d refuses that) and leaves them alone. Sharded, every micro-step is a
        # reduce-scatter that every rank must join: an empty one runs as such a zero-weighted sample.
        steps = micro if self.scatter is not None else tuple(size for size in micro if size) or (0,)
        for m, size in enumerate(steps):
            data = self.stream.batch(self.task.dataset, self.task.collate, position if size else 0, max(size, 1))
            data = to_device(data, self.device)
            last = m == len(steps) - 1
            # Sharded, every micro-batch's gradient is reduce-scattered (`largebatch_trainer.sharding` says why).
            sync = contextlib.nullcontext() if last or world == 1 or self.scatter else self.model.no_sync()
            with sync, _eval_mode(self.model, not size):
                with accelerator.autocast(self.device, self.precision):  # the forward pass only
                    step_loss, count = self.task.loss(self.model, data)
                step_loss = step_loss.float()
                scaled = step_loss * ((1.0 if size else 0.0) / batch)
                if world == 1 and len(steps) > 1:
                    grads = torch.autograd.grad(scaled, params)
                    micro_norms.append((size, noise.squared_norm(grads, params, weights) * (batch / size) ** 2))
                    for p, g in zip(params, grads, strict=True):
                        p.grad = g if p.grad is None else p.grad.add_(g)
                elif self.scatter is not None:
                    self.scatter.scale = (batch / size) ** 2 if size else 0.0
                    scaled.backward()
                    micro_norms.append((size, self.scatter.take()))  # measured before the reduce-scatter
                else:
                    scaled.backward()
            if size:
                loss_sum += step_loss.detach().double()
                position += size
        return loss_sum, micro_norms

    def _statistics(
        self,
        loss_sum: torch.Tensor,
        micro: tuple[int, ...],
        micro_norms: list[tuple[int, torch.Tensor]],
        batch: int,
        measure: bool,
        params: list[torch.Tensor],
    ) -> StepStats:
        """This rank's part of the step's all-reduce. Its small batches are its whole share on several ranks
        (the norm the hook took before the all-reduce), each micro-batch's gradient on one and when sharded;
        sharded, its shard's part of |G|² too."""
        rank_samples = sum(micro)
        stats = StepStats(loss_sum=loss_sum, stop=float(self.stop.requested), samples=rank_samples)
        if measure and self.scatter is not None:
            stats.shard_sq = sharding.local_squared_norm(params, self.scatter.weights)
        if measure and self.env.world_size > 1 and rank_samples and self.scatter is None:
            stats.small_sq = self.hook.local_sq * (batch / rank_samples) ** 2
            stats.inverse_sizes = 1.0 / rank_samples
            stats.smalls = 1.0
        elif measure and micro_norms:
            # Sharded, an empty micro-batch adds no small batch; preconditioned, its norm holds other ranks'.
            sizes = [size for size, _ in micro_norms if size]
            stats.small_sq = torch.stack([g_sq for _, g_sq in micro_norms]).sum()
            stats.inverse_sizes = sum(1.0 / size for size in sizes)
            stats.smalls = len(sizes)
        return stats

    def _global_sq(
        self, micro_norms: list[tuple[int, torch.Tensor]], params: list[torch.Tensor], weights
    ) -> torch.Tensor | None:
        """|G|² of the step's whole gradient, taken before the optimizer step consumes it: the hook's after
        the all-reduce on several ranks, the accumulated one's on a single worker with several micro-batches
        (None when nothing is measured, or sharded: then it is the sum of the ranks' `shard_sq`)."""
        if self.scatter is not None:
            return None
        if self.env.world_size > 1:
            return self.hook.global_sq.clone()
        if micro_norms:
            return noise.squared_norm([p.grad for p in params], params, weights)
        return None

    def _update_noise(self, totals: StepStats, batch: int, global_sq: torch.Tensor | None) -> None:
        """Feed the noise-scale averages with this step's all-reduced small-batch statistics and |G|²."""
        if self.scatter is not None:
            global_sq = totals.shard_sq / self.replicas  # each shard's squares, once per replica
        if totals.smalls >= 2:  # at least two small batches: the estimators are defined
            b_small = totals.smalls / totals.inverse_sizes
            if b_small < batch:
                self.noise.update(b_small, totals.small_sq / totals.smalls, batch, float(global_sq))

    def _advance(self, plan: schedule.Plan, split: schedule.Split, started: float, totals: StepStats) -> None:
        """The step is done: the history, the progress, the loss, the throughput, the metrics, the report."""
        batch = plan.global_batch
        self.history.record(self.progress.step, self.progress.samples, plan.policy_batch, self.env.world_size)
        self.progress = dataclasses.replace(schedule.advance(self.progress, plan), noise_scale=self.noise.value)
        elapsed = time.perf_counter() - started
        self.last_loss = totals.loss_sum / batch
        rate = batch / elapsed
        self.throughput = rate if self.throughput is None else 0.9 * self.throughput + 0.1 * rate
        self._update_metrics(plan, split, elapsed, int(totals.samples))
        self._report()

    def _measure_by_halves(self) -> bool:
        """A lone micro-batch gives one small batch, and the noise scale needs two: on a measuring step
        of a policy that reads the noise scale, it runs as two halves (the same gradient, summed)."""
        cb = self.spec.batch.policy.critical_batch
        return self.spec.measures_noise_scale and self.progress.step % cb.measure_every_steps == 0

    def _evaluate_when_due(self) -> None:
        """Held-out loss at every multiple of evaluation.everySamples the step passed, and at the end. Rank 0
        alone evaluates a replicated model (the weights are the same on every rank); the others wait at the
        next all-reduce. A sharded one needs every rank for its forward pass: all evaluate the same samples."""
        if self.task.eval_dataset is None or (self.env.rank != 0 and self.scatter is None):
            return
        every, samples = self.spec.evaluation.every_samples, self.progress.samples
        previous = self.evaluations.latest[1] if self.evaluations.latest else 0
        due = samples >= self.spec.schedule.total_samples or (every and samples // every > previous // every)
        if due:
            self.evaluations.add(self.progress.step, samples, *self.evaluate())
            self.metrics.evaluation(*self.evaluations.latest[2:])

    # --- reporting --------------------------------------------------------------------------------

    def _update_metrics(self, plan: schedule.Plan, split: schedule.Split, elapsed: float, consumed: int) -> None:
        self.plan_status = reporting.plan_status(plan, split, self.env.world_size)
        reporting.record_step(
            self.metrics, self.plan_status, plan, elapsed, consumed, self.task.tokens_per_sample,
            self.throughput, self.last_loss, self.progress.samples, self.noise.value,
        )  # fmt: skip

    def status(self, done: bool = False) -> dict:
        """The report of rank 0 (`largebatch.report`): the job's `status.progress` and `status.plan`."""
        progress = reporting.progress_status(
            self.progress, self.task.tokens_per_sample, self.last_loss, self.evaluations.latest, self.noise.value,
            self.throughput, self.restarts, done,
        )  # fmt: skip
        return report.report(progress, self.plan_status)

    def report_done(self) -> None:
        """The job's data budget is spent (called after `close`, when every rank has finished)."""
        self._report(force=True, done=True)

    def _report(self, force: bool = False, done: bool = False) -> None:
        if self.env.rank != 0:
            return
        now = time.monotonic()
        if force or now - self._last_log >= self.options.log_seconds:
            self._last_log = now
            print(self.progress_line(), flush=True)
        if self.options.sink is not None and (force or now - self._last_report >= self.options.report_seconds):
            self._last_report = now
            self.options.sink.report(self.status(done))

    def progress_line(self) -> str:
        return reporting.progress_line(
            self.progress, self.plan_status, self.env.world_size, self.spec.schedule.total_samples,
            self.last_loss, self.throughput,
        )  # fmt: skip

    def evaluate(self) -> tuple[float, float | None]:
        """Held-out loss (and accuracy) of the model as it is now (`evaluation.held_out`)."""
        micro = self.spec.batch.micro_batch_per_device
        return evaluation.held_out(
            self.task, self.module, self.device, self.precision, self.spec.evaluation.samples, micro
        )

    def close(self, clean: bool) -> None:
        """Leave the process group, every rank together when the run ended cleanly.

        DDP goes first, so that its communication hook and the hook's state are released here, on the
        main thread, and not during interpreter shutdown. The group's gloo threads outlive all of this
        (DDP's C++ reducer keeps the group alive: docs/trainer.md, "Ending"), which is why a finished
        worker leaves through `main.exit_process`."""
        if clean:
            self.wait_for_save()
        if not dist.is_initialized():
            return
        if clean:
            dist.barrier()  # every rank has finished its last step and the final checkpoint is written
        self.model, self.hook, self.scatter = self.module, None, None
        gc.collect()
        dist.destroy_process_group()


def _dump_plan(plan: PlanStatus) -> dict:
    return plan.model_dump(mode="json", by_alias=True, exclude_none=True)


def _load_plan(saved: dict | None) -> PlanStatus:
    return PlanStatus.model_validate(saved or {})


class _StopFlag:
    """Set by SIGTERM/SIGINT; the signal handler holds this flag, not the trainer."""

    def __init__(self):
        self.requested = False

    def set(self, _signum=None, _frame=None) -> None:
        self.requested = True


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module, on: bool):
    """`model` in eval mode inside the block when `on` (it trains again after it)."""
    if not on:
        yield
        return
    model.eval()
    try:
        yield
    finally:
        model.train()
