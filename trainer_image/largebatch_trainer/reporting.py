"""What rank 0 says about the run after each step: the job's `status.plan` and `status.progress` (the report
a `Sink` sends), the Prometheus metrics, and the progress line `kubectl logs` of a worker shows. Plain
functions of what the trainer knows; the trainer decides when to call them."""

from __future__ import annotations

from largebatch import schedule, timestamps
from largebatch.api import PlanStatus, ProgressStatus
from largebatch_trainer.metrics import Metrics


def plan_status(plan: schedule.Plan, split: schedule.Split, world: int) -> PlanStatus:
    return PlanStatus(
        global_batch=plan.global_batch,
        micro_batch=split.max_micro_batch,
        accumulation_steps=split.accumulation_steps,
        world_size=world,
        lr=plan.lr,
        policy_phase=plan.phase,
    )


def record_step(
    m: Metrics,
    status: PlanStatus,
    plan: schedule.Plan,
    elapsed: float,
    consumed: int,
    tokens: int,
    throughput: float,
    loss: float | None,
    samples: int,
    noise_scale: float | None,
) -> None:
    """One step's metrics: `consumed` samples in `elapsed` seconds, the run at `samples`."""
    m.samples.inc(consumed)
    m.tokens.inc(consumed * tokens)
    m.steps.inc()
    m.step_seconds.observe(elapsed)
    m.samples_per_second.set(throughput)
    m.tokens_per_second.set(throughput * tokens)
    m.loss.set(loss)
    m.lr.set(plan.lr)
    m.global_batch.set(consumed)
    m.global_batch_target.set(plan.policy_batch)
    m.micro_batch.set(status.micro_batch)
    m.accumulation.set(status.accumulation_steps)
    m.world_size.set(status.world_size)
    m.progress.set(samples)
    if noise_scale is not None:
        m.noise_scale(noise_scale)


def progress_status(
    p: schedule.Progress,
    tokens: int,
    loss: float | None,
    latest_evaluation: list | None,
    noise_scale: float | None,
    throughput: float | None,
    restarts: int,
    done: bool,
) -> ProgressStatus:
    """The job's `status.progress`; `latest_evaluation` is [step, samples, loss, accuracy or None]."""
    latest = latest_evaluation
    return ProgressStatus(
        step=p.step,
        samples=p.samples,
        tokens=p.samples * tokens,
        loss=loss,
        eval_loss=latest[2] if latest else None,
        eval_accuracy=latest[3] if latest else None,
        eval_step=latest[0] if latest else None,
        noise_scale=noise_scale,
        samples_per_second=throughput,
        policy_batch=p.batch,
        last_change_step=p.last_change_step,
        done=done,
        elastic_restarts=restarts,
        time=timestamps.stamp(timestamps.now()),
    )


def progress_line(
    p: schedule.Progress, plan: PlanStatus, world: int, total: int, loss: float | None, throughput: float | None
) -> str:
    """`step 1200 samples 19200/128000 batch 16 (world 1 x accumulation 1) lr 3.00e-03 loss 2.4312 ...`"""
    fields = [f"step {p.step}", f"samples {p.samples}/{total}", f"batch {p.batch}",
              f"(world {world} x accumulation {plan.accumulation_steps})"]  # fmt: skip
    fields += [f"lr {plan.lr:.3g}"] if plan.lr is not None else []
    fields += [f"loss {loss:.4f}"] if loss is not None else []
    fields += [f"{throughput:.0f} samples/s"] if throughput is not None else []
    return " ".join(fields)
