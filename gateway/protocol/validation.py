"""Turn pydantic validation failures into one clear client error."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, ValidationError

from gateway.protocol.errors import ApiError

# Below this a sampling temperature is greedy in all but exact ties, and dividing logits by it
# overflows (5e-324 made them inf and the probabilities NaN): such a temperature samples greedily.
MIN_SAMPLING_TEMPERATURE = 0.01


def _greedy_below_minimum(value: float) -> float:
    return 0.0 if value < MIN_SAMPLING_TEMPERATURE else value


# A request's or a session's sampling temperature: 0 (greedy) or 0.01..2; (0, 0.01) means 0.
Temperature = Annotated[float, Field(ge=0.0, le=2.0), AfterValidator(_greedy_below_minimum)]

_MISSING = {"missing"}
_TYPE_ERRORS = {
    "string_type",
    "int_type",
    "int_parsing",
    "float_type",
    "float_parsing",
    "bool_type",
    "bool_parsing",
    "list_type",
    "dict_type",
    "model_type",
    "model_attributes_type",
}


def _dotted(location: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for part in location:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        else:
            parts.append(("." if parts else "") + part)
    return "".join(parts)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "none"})


def api_error_from_validation(
    exc: ValidationError, *, prefix: str = "", union_tags: frozenset[str] = frozenset()
) -> ApiError:
    """The first problem, named by its dotted path (e.g. `session.audio.input.format.type`).

    `union_tags` are discriminator values pydantic puts into locations; clients know fields by name only.
    Union members' own tags (`str`, `literal[...]`, a model's class name) are dropped too: the API's
    field names are all lower-case snake_case.
    """
    first = exc.errors(include_url=False)[0]
    location = tuple(
        part
        for part in first["loc"]
        if not (isinstance(part, str) and (part in union_tags or part in _TYPE_TAGS or "[" in part
                                           or part.startswith("function-") or part[:1].isupper()))
    )
    param = _dotted(location)
    if prefix:
        param = f"{prefix}.{param}" if param else prefix
    kind = first["type"]
    if kind in _MISSING:
        return ApiError("missing_required_parameter", f"Missing required parameter: '{param}'.", param)
    if kind in _TYPE_ERRORS:
        return ApiError("invalid_type", f"Invalid type for '{param}': {first['msg']}.", param)
    if kind == "extra_forbidden":
        return ApiError("unknown_parameter", f"Unknown parameter: '{param}'.", param)
    return ApiError("invalid_value", f"Invalid value for '{param}': {first['msg']}.", param)
