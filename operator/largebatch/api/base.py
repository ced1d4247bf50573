"""What every model of the API shares: the group and kind, the bounds, `Rule` (a cross-field rule as CEL
and as Python) and `_Model` (camelCase on the wire, strict, docstrings as descriptions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel

GROUP = "largebatch.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LargeBatchJob"
PLURAL = "largebatchjobs"
SHORT_NAME = "lbj"
# Worker pods are named `<job>-worker-<n>`; their names must stay valid DNS labels (63 characters).
MAX_NAME_LENGTH = 50
# Bounds on the numbers that make planning or a step's work grow with them: nothing a user writes may
# turn `lbctl plan` or a step into a hang.
MAX_RAMP_LEVELS = 10_000
MAX_ACCUMULATION = 65_536
MAX_TOTAL_SAMPLES = 10**15


class Rule(NamedTuple):
    """A cross-field rule: `cel` for the API server, `check` for Python, one `message` for both."""

    cel: str
    message: str
    check: Callable[[Any], bool]
    got: Callable[[Any], str]
    field_path: str | None = None


class _Model(BaseModel):
    """Base for API objects: camelCase on the wire, unknown fields rejected, docstrings as descriptions.
    Types are checked as the API server checks them: no bool or numeric string for an integer, no float
    where an integer belongs, no NaN or infinity."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
        strict=True,
        allow_inf_nan=False,
    )
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self, info: ValidationInfo) -> _Model:
        if info.context and info.context.get("skip_rules"):  # to compare the rules with their CEL
            return self
        for rule in type(self).rules:
            if not rule.check(self):
                raise ValueError(f"{rule.message} (got {rule.got(self)})")
        return self

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):  # noqa: ANN001 - pydantic hook
        schema = handler(core_schema)
        if cls.rules:
            target = handler.resolve_ref_schema(schema)
            target["x-kubernetes-validations"] = [
                {"rule": r.cel, "message": r.message} | ({"fieldPath": r.field_path} if r.field_path else {})
                for r in cls.rules
            ]
        return schema


def _sub(model: type[_Model]) -> Any:
    """A nested block that may be omitted: it then takes its own defaults. The CRD spells the defaults
    out in full: the API server checks the block's CEL rules against the default as written."""
    return Field(
        default_factory=model,
        json_schema_extra=lambda schema: schema.update(
            default=model().model_dump(mode="json", by_alias=True, exclude_none=True)
        ),
    )


# A Kubernetes resource quantity ("500m", "4Gi", 2).
Quantity = Annotated[int | str, WithJsonSchema({"x-kubernetes-int-or-string": True})]
# Free-form objects kept as written (task arguments, node affinity).
FreeForm = Annotated[dict[str, Any], WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True})]
