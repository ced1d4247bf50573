"""The API models: examples validate, cross-field rules reject bad input naming the field and numbers,
and each rule's CEL (what the API server checks) agrees with its Python check."""

from __future__ import annotations

import celpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from largebatch import api
from tests.helpers import EXAMPLES, example, make_spec, spec_dict

EXAMPLE_FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))


def test_there_is_an_example_per_policy():
    policies = {example(name).spec.batch.policy.type for name in EXAMPLE_FILES}
    assert policies == {"constant", "linearRamp", "seesaw", "criticalBatch"}


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_examples_are_valid_jobs(name):
    job = example(name)
    assert job.kind == "LargeBatchJob"
    assert job.spec.batch.initial <= job.spec.batch.max


@pytest.mark.parametrize(
    ("overrides", "field", "numbers"),
    [
        ({"workers": {"min": 5, "max": 2}}, "workers.min must be <= workers.max", "min=5, max=2"),
        ({"batch": {"initial": 512, "max": 256}}, "batch.initial must be <= batch.max", "initial=512, max=256"),
        (
            {"schedule": {"totalSamples": 100, "warmupSamples": 100}},
            "schedule.warmupSamples must be < schedule.totalSamples",
            "warmupSamples=100, totalSamples=100",
        ),
        (
            {"batch": {"policy": {"type": "seesaw", "seesaw": {"factor": 2, "batchFactor": 4}}}},
            "Seesaw stability limit",
            "batchFactor=4.0, factor=2.0",
        ),
        (
            {"batch": {"policy": {"type": "linearRamp"}}},
            "batch.policy.linearRamp is required",
            "type=linearRamp, linearRamp missing",
        ),
        (
            {"batch": {"policy": {"type": "linearRamp", "linearRamp": {"increment": 100, "rampSamples": 10}}}},
            "multiple of batch.policy.linearRamp.increment",
            "max-initial=240, increment=100",
        ),
        (
            {"batch": {"policy": {"type": "seesaw"}}, "schedule": {"decay": "constant"}},
            "seesaw needs a decaying schedule",
            "decay=constant",
        ),
        (
            {"batch": {"initial": 1, "policy": {"type": "criticalBatch"}}},
            "batch.policy.type criticalBatch needs batch.initial >= 2",
            "policy=criticalBatch, initial=1",
        ),
        (
            {
                "batch": {"policy": {"type": "criticalBatch", "criticalBatch": {"estimator": "preconditioned"}}},
                "optimizer": {"name": "sgd", "lr": 0.1},
            },
            "estimator preconditioned needs an optimizer with a second-moment preconditioner (adamw, lamb)",
            "optimizer=sgd",
        ),
        (
            {"batch": {"initial": 48, "max": 256, "bnBatch": 32}},
            "batch.initial and batch.max must be multiples of batch.bnBatch",
            "initial=48, max=256, bnBatch=32",
        ),
        (
            {"batch": {"initial": 32, "max": 256, "microBatchPerDevice": 16, "bnBatch": 32}},
            "batch.microBatchPerDevice must be >= batch.bnBatch",
            "microBatchPerDevice=16, bnBatch=32",
        ),
        (
            {"batch": {"initial": 2, "max": 262_144, "microBatchPerDevice": 16, "bnBatch": 2}},
            "batch.max must be <= batch.bnBatch x 65,536",
            "max=262,144, bnBatch=2",
        ),
        (
            {
                "batch": {
                    "bnBatch": 16,
                    "policy": {"type": "linearRamp", "linearRamp": {"increment": 24, "rampSamples": 10}},
                    "initial": 16,
                    "max": 256,
                }
            },
            "batch.policy.linearRamp.increment must be a multiple of batch.bnBatch",
            "increment=24, bnBatch=16",
        ),
        (
            {
                "batch": {"initial": 32, "max": 256, "microBatchPerDevice": 32, "bnBatch": 32},
                "schedule": {"totalSamples": 28_740},
            },
            "schedule.totalSamples must be a multiple of batch.bnBatch",
            "totalSamples=28,740, bnBatch=32",
        ),
        (
            {"batch": {"initial": 16, "bnBatch": 16, "policy": {"type": "criticalBatch"}}},
            "criticalBatch with batch.bnBatch needs batch.initial >= 2 x bnBatch",
            "initial=16, bnBatch=16",
        ),
        (
            {"metrics": {"port": 65534}, "workers": {"devicesPerWorker": 4}},
            "metrics.port + workers.devicesPerWorker - 1 must be <= 65535",
            "port=65534, devicesPerWorker=4",
        ),
        (
            {"gradientAllReduce": "bf16", "precision": "fp32", "workers": {"accelerator": "nvidia.com/gpu"}},
            "gradientAllReduce bf16 needs precision bf16",
            "precision=fp32, accelerator=nvidia.com/gpu",
        ),
        (
            {"parallelism": {"dataParallel": "hybrid"}, "workers": {"devicesPerWorker": 1}},
            "parallelism.dataParallel hybrid shards within a worker pod's devicesPerWorker ranks and needs 2 or more",
            "devicesPerWorker=1",
        ),
        (
            {"gradientAllReduce": "bf16"},  # the base spec trains on the CPU: fp32 by default
            "set precision to bf16 or gradientAllReduce to fp32",
            "precision=unset, so fp32, accelerator=none",
        ),
    ],
)
def test_cross_field_rules_name_the_field_the_fix_and_the_numbers(overrides, field, numbers):
    with pytest.raises(ValidationError) as info:
        make_spec(**overrides)
    text = str(info.value)
    assert field in text
    assert f"(got {numbers})" in text


def test_unknown_fields_are_rejected():
    with pytest.raises(ValidationError, match="microBatchPerDevise"):
        api.LargeBatchJobSpec.model_validate(spec_dict(batch={"microBatchPerDevise": 4}))


def test_bf16_all_reduce_is_accepted_with_bf16_precision_explicit_or_by_default():
    assert make_spec(gradientAllReduce="bf16", precision="bf16").gradient_all_reduce == "bf16"
    assert make_spec(gradientAllReduce="bf16", workers={"accelerator": "nvidia.com/gpu"}).resolved_precision == "bf16"
    assert make_spec().task.compile is False and make_spec().gradient_all_reduce == "fp32"


def test_base_batch_defaults_to_the_initial_batch():
    assert make_spec().base_batch == 16
    assert make_spec(optimizer={"baseBatch": 256}).base_batch == 256


# --- CEL and Python say the same thing --------------------------------------------------------------


# Where in a spec each model with rules sits (the object its CEL rules see as `self`).
RULE_LEVELS = {
    api.WorkersSpec: ["workers"],
    api.PodOverrides: ["workers", "pod"],
    api.SeesawSpec: ["batch", "policy", "seesaw"],
    api.PolicySpec: ["batch", "policy"],
    api.BatchSpec: ["batch"],
    api.ScheduleSpec: ["schedule"],
    api.LargeBatchJobSpec: [],
}


def _all_rules():
    return [(model, rule) for model in RULE_LEVELS for rule in model.rules]


def test_every_model_with_rules_is_covered():
    def walk(model, seen):
        if model in seen:
            return
        seen.add(model)
        for field in model.model_fields.values():
            for arg in [field.annotation, *getattr(field.annotation, "__args__", ())]:
                if isinstance(arg, type) and issubclass(arg, api._Model):
                    walk(arg, seen)

    seen: set = set()
    walk(api.LargeBatchJobSpec, seen)
    assert {m for m in seen if m.rules} == {m for m, _ in _all_rules()}


estimators = st.sampled_from(["simple", "preconditioned"])
# Mount paths that clash with each other, with the checkpoints (theirs or the default) and with the pod's own.
mount_paths = st.sampled_from(["/data", "/ckpt", api.CHECKPOINT_PATH_DEFAULT, api.JOB_DIR, api.SHM_DIR])
data_volumes = st.fixed_dictionaries({"claimName": st.just("corpus"), "mountPath": mount_paths})
candidate_specs = st.fixed_dictionaries(
    {
        "workers": st.fixed_dictionaries(
            {"min": st.integers(1, 6), "max": st.integers(1, 6)},
            optional={
                "devicesPerWorker": st.integers(1, 3),
                "accelerator": st.sampled_from(["nvidia.com/gpu", "google.com/tpu", "none"]),
                "pod": st.fixed_dictionaries({"volumes": st.lists(data_volumes, max_size=3)}),
            },
        ),
        "batch": st.fixed_dictionaries(
            {
                "initial": st.integers(1, 300),
                "max": st.integers(1, 300),
                "microBatchPerDevice": st.integers(1, 40),
                "bnBatch": st.none() | st.integers(1, 40),
                "policy": st.one_of(
                    st.fixed_dictionaries(
                        {
                            "type": st.just("seesaw"),
                            "seesaw": st.fixed_dictionaries(
                                {"factor": st.sampled_from([1.5, 2.0, 3.0])},
                                optional={
                                    "batchFactor": st.sampled_from([1.2, 2.0, 4.0]),
                                    "capAtCriticalBatch": st.booleans(),
                                },
                            ),
                        },
                        optional={"criticalBatch": st.fixed_dictionaries({}, optional={"estimator": estimators})},
                    ),
                    st.fixed_dictionaries(
                        {"type": st.just("linearRamp")},
                        optional={
                            "linearRamp": st.fixed_dictionaries(
                                {"increment": st.integers(1, 50), "rampSamples": st.just(100)}
                            )
                        },
                    ),
                    st.fixed_dictionaries(
                        {"type": st.sampled_from(["constant", "criticalBatch"])},
                        optional={"criticalBatch": st.fixed_dictionaries({}, optional={"estimator": estimators})},
                    ),
                ),
            }
        ),
        "optimizer": st.fixed_dictionaries(
            {"name": st.sampled_from(["sgd", "adamw", "lamb", "lars"]), "lr": st.just(0.1)}
        ),
        "schedule": st.fixed_dictionaries(
            {
                "totalSamples": st.integers(1, 100),
                "warmupSamples": st.integers(0, 100),
                "decay": st.sampled_from(["cosine", "constant"]),
            }
        ),
    },
    optional={
        "precision": st.sampled_from(["fp32", "bf16"]),
        "gradientAllReduce": st.sampled_from(["fp32", "bf16"]),
        "checkpoint": st.fixed_dictionaries({"path": st.sampled_from(["/ckpt", "/data"])}),
        "parallelism": st.fixed_dictionaries(
            {}, optional={"dataParallel": st.sampled_from(["replicate", "shard", "hybrid"])}
        ),
    },
)


def _cel_verdicts(document: dict) -> list[bool]:
    """Evaluate every CEL rule where the API server would: on the object at the rule's level."""
    env = celpy.Environment()
    verdicts = []
    for model, rule in _all_rules():
        node = document
        for key in RULE_LEVELS[model]:
            node = node.get(key, {})
        program = env.program(env.compile(rule.cel))
        verdicts.append(bool(program.evaluate({"self": celpy.json_to_cel(node)})))
    return verdicts


@settings(max_examples=300, deadline=None)
@given(candidate_specs)
def test_cel_rules_and_python_checks_agree(overrides):
    raw = spec_dict(**overrides)
    # Field-level bounds come first (schema in the API server, pydantic here); compare only the rules.
    try:
        typed = api.LargeBatchJobSpec.model_validate(raw, context={"skip_rules": True})
    except ValidationError:
        return
    document = typed.model_dump(mode="json", by_alias=True, exclude_none=True)
    python = [rule.check(_locate(typed, model)) for model, rule in _all_rules()]
    assert _cel_verdicts(document) == python
    # And with the rules on, pydantic accepts exactly the specs that every rule accepts.
    try:
        api.LargeBatchJobSpec.model_validate(raw)
        accepted = True
    except ValidationError:
        accepted = False
    assert accepted == all(python)


def _locate(spec, model):
    for key in RULE_LEVELS[model]:
        spec = getattr(spec, key)
    return spec
