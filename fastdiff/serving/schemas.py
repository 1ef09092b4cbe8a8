"""Request validation for ``POST /v1/generate``: a pydantic model built once per server from its model and limits.

Every limit is a pydantic constraint, so a bad value is a 422 whose ``detail`` names the field (``loc``) and
what is allowed. Unknown fields are refused (``extra="forbid"``): nothing else is taken from a client, and in
particular no file path or accelerator spec (profiles are fixed at start and chosen by name).

Example::

    from fastdiff.serving.schemas import Limits, ModelFacts, request_model

    Request = request_model(ModelFacts(kind="label", num_classes=10, size_factor=4, fixed_size=16),
                            Limits(), profiles=("fast", "quality"))
    Request(label=3, steps=10, profile="fast")          # ok
    Request(label=12)                                    # ValidationError at ("label",): <= 9
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator
from pydantic_core import PydanticCustomError

MAX_SEED = 2**53 - 1  # the largest integer every JSON client (JavaScript's numbers) carries exactly


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; ``max_body_bytes`` is enforced before the JSON is parsed (413)."""

    max_steps: int = 200
    max_count: int = 8
    max_side: int = 1024
    max_prompt_chars: int = 500
    max_guidance: float = 30.0
    max_body_bytes: int = 16_384


@dataclass(frozen=True)
class ModelFacts:
    """What the served model takes: ``kind`` "prompt" (text models) or "label" (class-conditional)."""

    kind: Literal["prompt", "label"]
    num_classes: int = 0
    size_factor: int = 8  # width and height must be multiples of this
    fixed_size: int | None = None  # pixel-space models with one image size (digits: 16)
    default_size: int | None = None


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


def request_model(facts: ModelFacts, limits: Limits, profiles: tuple[str, ...], step_limits=None) -> type[BaseModel]:
    """The request class of a server over a model with ``facts``, bounded by ``limits``, offering ``profiles``;
    ``step_limits`` (profile -> ``fastdiff.core.calls.StepLimit``): the step counts the library allows under
    each profile (the scheduler's range, a tuned schedule's or a student's count), checked per request."""
    if not profiles:
        raise ValueError("at least one profile is needed")
    allowed = _allowed_steps(limits.max_steps, profiles, step_limits or {})
    text = Field(min_length=1, max_length=limits.max_prompt_chars)
    if facts.fixed_size is not None:  # the model makes one size: allow only that size
        side: Any = Field(default=None, ge=facts.fixed_size, le=facts.fixed_size)
    else:
        side = Field(default=None, ge=facts.size_factor, le=limits.max_side, multiple_of=facts.size_factor)
    fields: dict[str, Any] = {
        "profile": (Literal[profiles], Field(default=profiles[0])),  # type: ignore[valid-type]
        "steps": (
            int | None,
            Field(
                default=None,
                ge=1,
                le=max((max(c) for c in allowed.values() if c), default=1),
                description=_describe(allowed),
            ),
        ),
        "guidance": (float | None, Field(default=None, ge=0.0, le=limits.max_guidance, allow_inf_nan=False)),
        "seed": (int | None, Field(default=None, ge=0, le=MAX_SEED)),
        "width": (int | None, side),
        "height": (int | None, side),
        "count": (int, Field(default=1, ge=1, le=limits.max_count)),
    }
    if facts.kind == "prompt":
        fields["prompt"] = (str, text)
        fields["negative_prompt"] = (str | None, Field(default=None, max_length=limits.max_prompt_chars))
    else:
        fields["label"] = (int, Field(ge=0, le=facts.num_classes - 1))

    def check_steps(steps, info: ValidationInfo):
        profile = info.data.get("profile")  # validated first (fields are validated in order)
        if steps is not None and profile in allowed and steps not in allowed[profile]:
            raise PydanticCustomError(
                "steps_not_allowed",
                "steps={steps} is not allowed under profile '{profile}': allowed {what}",
                {"steps": steps, "profile": profile, "what": _counts(allowed[profile])},
            )
        return steps

    numbers = [name for name in ("steps", "seed", "width", "height", "count", "label", "guidance") if name in fields]
    validators = {
        "check_steps": field_validator("steps")(check_steps),
        "json_numbers": field_validator(*numbers, mode="before")(_json_number),
    }
    return create_model("GenerateRequest", __base__=_Base, __validators__=validators, **fields)


def _json_number(value):
    # pydantic's lax mode turns true/false and "3" into numbers; the schema (JSON Schema) does not. 2.0 is an integer.
    if isinstance(value, (bool, str)):
        raise PydanticCustomError(
            "number_type", "Input should be a JSON number, not {kind}", {"kind": type(value).__name__}
        )
    return value


def _allowed_steps(max_steps: int, profiles, step_limits) -> dict[str, range | frozenset[int]]:
    """Per profile: the step counts both ``--max-steps`` and the library allow."""
    out: dict[str, range | frozenset[int]] = {}
    for name in profiles:
        limit = step_limits.get(name)
        top = max_steps if limit is None or limit.maximum is None else min(max_steps, limit.maximum)
        if limit is not None and limit.only is not None:
            out[name] = frozenset(n for n in limit.only if 1 <= n <= top)
        else:
            out[name] = range(1, top + 1)
    return out


def _counts(counts) -> str:
    if isinstance(counts, range):
        return f"1 to {counts.stop - 1}"
    return ", ".join(map(str, sorted(counts))) or "none"


def _describe(allowed) -> str:
    parts = [f"{name}: {_counts(counts)}" for name, counts in allowed.items()]
    return "denoising steps allowed per profile (" + "; ".join(parts) + ")"


class ValidationErrorBody(BaseModel):
    detail: list[dict[str, Any]] = Field(description="one entry per bad field: loc (where), msg (what is allowed)")


class ErrorBody(BaseModel):
    detail: str = Field(description="what went wrong")
    request_id: str | None = Field(default=None, description="also in the server log line (X-Request-Id)")


class Timings(BaseModel):
    queue_s: float = Field(description="from arrival to the start of its batch")
    denoise_s: float = Field(description="the batch's pipeline call up to its last step (text encoding included)")
    decode_s: float = Field(description="the batch's decode and post-processing after the last step")
    total_s: float = Field(description="arrival to response")


class GenerateResponse(BaseModel):
    images: list[str] = Field(description="base64 PNGs")
    seeds: list[int] = Field(description="the seed of each image: the image depends only on it and the request")
    profile: str
    spec: str = Field(description="the profile's accelerator specs ('' for none)")
    batch_size: int = Field(description="images in the pipeline call this request was part of")
    timings: Timings
