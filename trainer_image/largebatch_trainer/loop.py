"""The training loop: one optimizer step at a time, exactly as `largebatch.schedule` plans it.

Each step: plan the batch and LR from the exact progress, split the batch over ranks and micro-batches,
run the micro-steps with the loss divided by the global batch (gradients are summed, never averaged, so
any world size, uneven split or accumulation gives the full-batch gradient), measure the gradient noise
scale on the way, step the optimizer, advance the progress. Checkpoints on a cadence, on SIGTERM/SIGINT
and at the end; the newest one is loaded on every start. The precision, the all-reduce dtype and
torch.compile are `largebatch_trainer.accelerator`'s.
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

from largebatch import launch, report, schedule, timestamps
from largebatch.api import LargeBatchJob, PlanStatus, ProgressStatus
from largebatch_trainer import accelerator, checkpoint, noise, optim
from largebatch_trainer.data import SampleStream, to_device
from largebatch_trainer.distributed import DistEnv, choose_device, init_process_group
from largebatch_trainer.metrics import Metrics
from largebatch_trainer.progress import Sink
from largebatch_trainer.tasks import Task, load_task


@dataclass
class Options:
    checkpoint_dir: Path
    device: str = "auto"
    metrics_port: int | None = None
    sink: Sink | None = None
    report_seconds: float = 2.0
    log_seconds: float = 10.0  # how often rank 0 prints a progress line (what `kubectl logs` of a worker shows)


class DivergenceError(ArithmeticError):
    """The loss became NaN or infinite: every later step would only spread it."""


class _Norms:
    """Squared norms of this step's local (pre-all-reduce) and global gradients, filled by the hook, with
    the preconditioner `weights` applied when the estimator is the preconditioned one."""

    def __init__(self, device: torch.device):
        # On the training device: reading them on the host would synchronise inside the backward pass.
        self.local_sq = torch.zeros((), dtype=torch.float64, device=device)
        self.global_sq = torch.zeros((), dtype=torch.float64, device=device)
        self.weights: dict[int, torch.Tensor] | None = None

    def reset(self, weights: dict[int, torch.Tensor] | None) -> None:
        self.local_sq.zero_()
        self.global_sq.zero_()
        self.weights = weights

    def squared(self, buffer: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
        # A bf16 all-reduce hands over bf16 buckets: their norms are still taken in fp32, since the noise
        # scale is a small difference of two of them.
        buffer = buffer.float()
        if self.weights is None:
            return torch.linalg.vector_norm(buffer).double().square()
        # A bucket's buffer is its parameters' gradients flattened one after another.
        views = [v.view_as(p) for v, p in zip(buffer.split([p.numel() for p in params]), params, strict=True)]
        return noise.squared_norm(views, params, self.weights)


def _sum_hook(norms, bucket):  # unannotated: DDP checks real annotations, and this module's are strings
    """DDP communication hook: all-reduce each gradient bucket with SUM (the loss is already divided by
    the global batch) and record its squared norm before and after."""
    buffer, params = bucket.buffer(), bucket.parameters()
    norms.local_sq += norms.squared(buffer, params)

    def record(future):
        reduced = future.value()[0]
        norms.global_sq += norms.squared(reduced, params)
        return reduced

    return dist.all_reduce(buffer, async_op=True).get_future().then(record)


def data_parallel(
    module: torch.nn.Module, device: torch.device, all_reduce: str
) -> tuple[torch.nn.parallel.DistributedDataParallel, _Norms]:
    """`module` under DDP, its gradients summed by `_sum_hook` in the `all_reduce` dtype, and the norms
    the hook measures."""
    model = torch.nn.parallel.DistributedDataParallel(
        module, device_ids=[device.index] if device.type == "cuda" else None
    )
    norms = _Norms(device)
    model.register_comm_hook(norms, accelerator.all_reduce_hook(_sum_hook, all_reduce))
    return model, norms


class Trainer:
    def __init__(self, job: LargeBatchJob, options: Options):
        self.job, self.spec, self.options = job, job.spec, options
        self.env = DistEnv.from_environ()
        self.device = choose_device(self.spec.workers.accelerator, options.device, self.env.local_rank)
        self.precision = accelerator.precision_on(self.spec, self.device)
        accelerator.configure(self.device, self.precision)
        init_process_group(self.env, self.device)
        self.task: Task = load_task(self.spec.task.entrypoint, self.spec.task.args, self.spec.task.seed)
        self.module = self.task.model.to(self.device)
        self.optimizer = optim.build(self.spec.optimizer, self.module, fused=self.device.type == "cuda")
        self.noise = noise.NoiseScale(self.spec.batch.policy.critical_batch.smoothing)
        self.estimator = self.spec.batch.policy.critical_batch.estimator
        self.evaluations: list[list] = []  # [step, samples, held-out loss, held-out accuracy or None]
        self.stream = SampleStream(len(self.task.dataset), self.spec.task.seed)
        self.progress = schedule.Progress()
        self.history: list[list[int]] = []  # [first step, first sample, batch, world size, steps]
        self.stop = _StopFlag()
        self.plan_status = PlanStatus()
        self.last_loss: float | None = None
        self._resume()
        self.model = self.module
        self.hook = None
        if self.env.world_size > 1:
            self.model, self.hook = data_parallel(self.module, self.device, self.spec.gradient_all_reduce)
        if self.spec.task.compile:
            # In place, so that the state dict keeps its keys; DDP compiled whole, so that Dynamo splits
            # the graph at DDP's buckets and their all-reduce still overlaps the backward pass.
            self.model.compile()
        self.metrics = Metrics(
            self.job.metadata.namespace or "default", self.job.metadata.name, self.env.rank, options.metrics_port
        )
        self.metrics.total.set(self.spec.schedule.total_samples)
        self.restarts = _restarts_of_any_agent(self.env.restart_count, self.device)
        self.metrics.restarts.set(self.restarts)
        if self.evaluations and self.env.rank == 0:  # the latest evaluation before this start, as it was
            self.metrics.evaluation(*self.evaluations[-1][2:])
        self.throughput: float | None = None
        self._last_report = self._last_log = 0.0

    # --- state ------------------------------------------------------------------------------------

    def _resume(self) -> None:
        # Rank 0 picks the newest intact checkpoint and every rank loads that one: ranks must never train
        # from different steps (another writer, or a file that went bad, could make them choose apart).
        chosen: list[str | None] = [None]
        state = None
        if self.env.rank == 0:
            found = checkpoint.newest_intact(self.options.checkpoint_dir)
            if found:
                chosen[0], state = found[0].name, found[1]
        if self.env.world_size > 1:
            dist.broadcast_object_list(chosen, src=0)
        if chosen[0] is None:
            return
        if state is None:
            state = checkpoint.load(self.options.checkpoint_dir / chosen[0])
        saved, ours = optim.layout(state["optimizer"]["param_groups"]), optim.layout(self.optimizer.param_groups)
        if saved != ours:
            raise SystemExit(
                f"checkpoint {self.options.checkpoint_dir / chosen[0]} holds optimizer groups {saved} (parameters, "
                f"μP LR scale) and this job's model has {ours}: task.args (parametrization, baseWidth or the "
                "model's shape) changed since it was written. Resume with the task.args it was written with, "
                "or set checkpoint.path to a new directory to start afresh"
            )
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress = schedule.Progress(**state["progress"])
        self.noise.load_state_dict(state["noise"])
        self.history = state["history"]
        self.evaluations = state.get("evaluations", [])
        torch.set_rng_state(state["rng"])
        # What the last step reported, so that a worker restarted after the end still reports it.
        self.last_loss = state.get("loss")
        self.plan_status = PlanStatus.model_validate(state.get("plan") or {})
        if self.env.rank == 0:
            print(f"resumed from checkpoint {chosen[0]} at step {self.progress.step} (samples "
                  f"{self.progress.samples}) with world size {self.env.world_size}", flush=True)  # fmt: skip

    def _save(self) -> None:
        if self.env.rank != 0:
            return
        started = time.perf_counter()
        payload = {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "progress": dataclasses.asdict(self.progress),
            "noise": self.noise.state_dict(),
            "history": self.history,
            "evaluations": self.evaluations,
            "rng": torch.get_rng_state(),
            "loss": self.last_loss,
            "plan": self.plan_status.model_dump(mode="json", by_alias=True, exclude_none=True),
        }
        checkpoint.save(self.options.checkpoint_dir, self.progress.step, payload, self.spec.checkpoint.keep)
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
                self._report(force=True)
                print(f"rank {self.env.rank}: stopped after step {self.progress.step}", file=sys.stderr, flush=True)
                return False
        return True

    def _step(self) -> bool:
        started = time.perf_counter()
        spec, env = self.spec, self.env
        plan = schedule.plan(spec, self.progress)
        world = env.world_size
        split = schedule.split(plan.global_batch, world, spec.batch.micro_batch_per_device, spec.batch.bn_batch)
        batch = plan.global_batch
        position = self.progress.samples + split.rank_offset(env.rank)
        micro = split.micro_batches[env.rank]
        # Never with bnBatch: a BN batch split in two would normalise over other samples.
        if world == 1 and len(micro) == 1 and micro[0] >= 2 and not spec.batch.bn_batch and self._measure_by_halves():
            micro = (micro[0] - micro[0] // 2, micro[0] // 2)
        # Two small batches or more (ranks or micro-batches) measure the noise scale. The preconditioned
        # estimator needs the optimizer's second moments: none before the first step.
        measure = world > 1 or len(micro) > 1
        weights = noise.preconditioners(self.optimizer) if measure and self.estimator == "preconditioned" else None
        measure = measure and (weights is not None or self.estimator == "simple")

        if self.hook is not None:
            self.hook.reset(weights)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        micro_norms: list[tuple[int, torch.Tensor]] = []  # single worker: (samples, |G_micro|²)
        params = [p for p in self.module.parameters() if p.requires_grad]
        # Empty micro-steps are skipped: the rank's gradients travel with its last real micro-step. A rank
        # with no samples at all still joins DDP's all-reduce with one micro-step on one sample weighted
        # zero, in eval mode: BatchNorm then uses its running statistics instead of normalising over a
        # batch of one (BatchNorm1d refuses that) and leaves them alone.
        steps = tuple(size for size in micro if size) or (0,)
        for m, size in enumerate(steps):
            data = self.stream.batch(self.task.dataset, self.task.collate, position if size else 0, max(size, 1))
            data = to_device(data, self.device)
            last = m == len(steps) - 1
            sync = contextlib.nullcontext() if last or world == 1 else self.model.no_sync()
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
                else:
                    scaled.backward()
            if size:
                loss_sum += step_loss.detach().double()
                position += size

        # Small-batch statistics, the global loss, the stop flag and the samples each rank ran travel in
        # one all-reduce: [loss sum, Σ |G_small|², Σ 1/B_small, small batches, stop, samples].
        stats = torch.zeros(6, dtype=torch.float64, device=self.device)
        stats[0] = loss_sum
        stats[4] = float(self.stop.requested)
        rank_samples = sum(micro)
        stats[5] = rank_samples
        if measure and world > 1 and rank_samples:
            stats[1] = self.hook.local_sq * (batch / rank_samples) ** 2
            stats[2] = 1.0 / rank_samples
            stats[3] = 1.0
        elif measure and micro_norms:
            stats[1] = torch.stack([g_sq for _, g_sq in micro_norms]).sum()
            stats[2] = sum(1.0 / size for size, _ in micro_norms)
            stats[3] = len(micro_norms)
        # The all-reduce overlaps the optimizer step; nothing below needs it until after the step.
        pending = dist.all_reduce(stats, async_op=True) if world > 1 else None
        if world > 1:
            global_sq = self.hook.global_sq.clone()
        elif micro_norms:
            global_sq = noise.squared_norm([p.grad for p in params], params, weights)
        # Here, not before the backward: the preconditioned estimator has read the moments as they stand.
        optim.set_lr(self.optimizer, plan.lr, plan.betas, plan.eps)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if pending is not None:
            pending.wait()
        loss_total, small_sq, inverse_sizes, smalls, stop, consumed = stats.tolist()  # the step's one host sync
        if not math.isfinite(loss_total):  # every rank sees the same all-reduced loss, so all stop here
            raise DivergenceError(
                f"{launch.DIVERGED}: the loss of step {self.progress.step + 1} is {loss_total / batch} (lr "
                f"{plan.lr:.4g}, global batch {batch}): lower optimizer.lr or lengthen schedule.warmupSamples"
            )
        if smalls >= 2:  # at least two small batches: the estimators are defined
            b_small = smalls / inverse_sizes
            if b_small < batch:
                self.noise.update(b_small, small_sq / smalls, batch, float(global_sq))

        self._record(plan, world)
        self.progress = dataclasses.replace(schedule.advance(self.progress, plan), noise_scale=self.noise.value)
        elapsed = time.perf_counter() - started
        self.last_loss = loss_total / batch
        rate = batch / elapsed
        self.throughput = rate if self.throughput is None else 0.9 * self.throughput + 0.1 * rate
        self._update_metrics(plan, split, elapsed, int(consumed))
        self._report()
        return bool(stop)

    def _measure_by_halves(self) -> bool:
        """A lone micro-batch gives one small batch, and the noise scale needs two: on a measuring step
        of a policy that reads the noise scale, it runs as two halves (the same gradient, summed)."""
        cb = self.spec.batch.policy.critical_batch
        return self.spec.measures_noise_scale and self.progress.step % cb.measure_every_steps == 0

    def _evaluate_when_due(self) -> None:
        """Held-out loss at every multiple of evaluation.everySamples the step passed, and at the end. Rank 0
        alone evaluates (the weights are the same on every rank); the others wait at the next all-reduce."""
        if self.task.eval_dataset is None or self.env.rank != 0:
            return
        every, samples = self.spec.evaluation.every_samples, self.progress.samples
        previous = self.evaluations[-1][1] if self.evaluations else 0
        due = samples >= self.spec.schedule.total_samples or (every and samples // every > previous // every)
        if due:
            self.evaluations.append([self.progress.step, samples, *self.evaluate()])
            self.metrics.evaluation(*self.evaluations[-1][2:])

    def _record(self, plan: schedule.Plan, world: int) -> None:
        last = self.history[-1] if self.history else None
        if last and last[2] == plan.policy_batch and last[3] == world and last[0] + last[4] == self.progress.step:
            last[4] += 1
        else:
            self.history.append([self.progress.step, self.progress.samples, plan.policy_batch, world, 1])

    # --- reporting --------------------------------------------------------------------------------

    def _update_metrics(self, plan: schedule.Plan, split: schedule.Split, elapsed: float, consumed: int) -> None:
        m, tokens = self.metrics, self.task.tokens_per_sample
        m.samples.inc(consumed)
        m.tokens.inc(consumed * tokens)
        m.steps.inc()
        m.step_seconds.observe(elapsed)
        m.samples_per_second.set(self.throughput)
        m.tokens_per_second.set(self.throughput * tokens)
        m.loss.set(self.last_loss)
        m.lr.set(plan.lr)
        m.global_batch.set(consumed)
        m.global_batch_target.set(plan.policy_batch)
        m.micro_batch.set(split.max_micro_batch)
        m.accumulation.set(split.accumulation_steps)
        m.world_size.set(self.env.world_size)
        m.progress.set(self.progress.samples)
        if self.noise.value is not None:
            m.noise_scale(self.noise.value)
        self.plan_status = PlanStatus(
            global_batch=plan.global_batch,
            micro_batch=split.max_micro_batch,
            accumulation_steps=split.accumulation_steps,
            world_size=self.env.world_size,
            lr=plan.lr,
            policy_phase=plan.phase,
        )

    def status(self, done: bool = False) -> dict:
        """The report of rank 0 (`largebatch.report`): the job's `status.progress` and `status.plan`."""
        p = self.progress
        progress = ProgressStatus(
            step=p.step,
            samples=p.samples,
            tokens=p.samples * self.task.tokens_per_sample,
            loss=self.last_loss,
            eval_loss=self.evaluations[-1][2] if self.evaluations else None,
            eval_accuracy=self.evaluations[-1][3] if self.evaluations else None,
            eval_step=self.evaluations[-1][0] if self.evaluations else None,
            noise_scale=self.noise.value,
            samples_per_second=self.throughput,
            policy_batch=p.batch,
            last_change_step=p.last_change_step,
            done=done,
            elastic_restarts=self.restarts,
            time=timestamps.stamp(timestamps.now()),
        )
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
        """`step 1200 samples 19200/128000 batch 16 (world 1 x accumulation 1) lr 3.00e-03 loss 2.4312 ...`"""
        p, plan, total = self.progress, self.plan_status, self.spec.schedule.total_samples
        fields = [f"step {p.step}", f"samples {p.samples}/{total}", f"batch {p.batch}",
                  f"(world {self.env.world_size} x accumulation {plan.accumulation_steps})"]  # fmt: skip
        fields += [f"lr {plan.lr:.3g}"] if plan.lr is not None else []
        fields += [f"loss {self.last_loss:.4f}"] if self.last_loss is not None else []
        fields += [f"{self.throughput:.0f} samples/s"] if self.throughput is not None else []
        return " ".join(fields)

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float | None]:
        """Mean loss per sample over the first `evaluation.samples` held-out samples, and the fraction
        classified right when the task reports accuracy (None otherwise). In eval mode: BatchNorm uses
        its running statistics."""
        data = self.task.eval_dataset
        count = min(len(data), self.spec.evaluation.samples)
        total, correct, micro = 0.0, 0.0, self.spec.batch.micro_batch_per_device
        self.module.eval()
        for start in range(0, count, micro):
            batch = self.task.collate([data[i] for i in range(start, min(count, start + micro))])
            batch = to_device(batch, self.device)
            with accelerator.autocast(self.device, self.precision):
                loss_sum, _ = self.task.loss(self.module, batch)
                if self.task.accuracy is not None:
                    correct += float(self.task.accuracy(self.module, batch)[0])
            total += float(loss_sum)
        self.module.train()
        return total / count, (correct / count if self.task.accuracy is not None else None)

    def close(self, clean: bool) -> None:
        """Leave the process group, every rank together when the run ended cleanly.

        DDP goes first, so that its communication hook and the hook's state are released here, on the
        main thread, and not during interpreter shutdown. The group's gloo threads outlive all of this
        (DDP's C++ reducer keeps the group alive: docs/trainer.md, "Ending"), which is why a finished
        worker leaves through `main.exit_process`."""
        if not dist.is_initialized():
            return
        if clean:
            dist.barrier()  # every rank has finished its last step and the final checkpoint is written
        self.model, self.hook = self.module, None
        gc.collect()
        dist.destroy_process_group()


class _StopFlag:
    """Set by SIGTERM/SIGINT; the signal handler holds this flag, not the trainer."""

    def __init__(self):
        self.requested = False

    def set(self, _signum=None, _frame=None) -> None:
        self.requested = True


def _restarts_of_any_agent(own: int, device: torch.device) -> int:
    """The most worker-group restarts any agent of the job has made. Each agent counts its own: when
    one node's worker dies, its agent counts a restart, while a peer may see only a membership change
    and count none; rank 0 alone would then report no restart at all."""
    if not dist.is_initialized():
        return own
    count = torch.tensor([own], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


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
