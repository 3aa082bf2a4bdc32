"""The one decoding boundary for JSON from clients: HTTP bodies, form fields and Realtime events.
No I/O: bytes or text in, plain JSON values or an ApiError out.

Whatever a client sends, the handlers behind it see only what every later step can handle: UTF-8
text, finite numbers of bounded size, nesting of bounded depth, and strings that are text (no lone
UTF-16 surrogate, which no UTF-8 encoder, the tokenizer's or the response's, can write).
"""

from __future__ import annotations

import json
import math
from typing import Any

from gateway.protocol.errors import ApiError

# Deep enough for any real request (a tool's JSON schema nests a few levels per level of its
# arguments), shallow enough that no recursive consumer (pydantic, json.dumps) comes near its limits.
MAX_DEPTH = 64


def decode_json(raw: bytes | str, *, param: str | None = None) -> Any:
    """Parse a JSON body (or one JSON form field, named by `param`); every malformed input is a 400
    `invalid_json`, with `param` naming where in the body the offending string is when it is known."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except UnicodeDecodeError:
        raise _invalid("it is not UTF-8", param) from None
    except RecursionError:
        raise _invalid(f"it nests deeper than {MAX_DEPTH} levels", param) from None
    except ValueError as exc:  # bad syntax, NaN/Infinity, an out-of-range float, an int of over 4,300 digits
        reason = "a number has too many digits" if "integer string conversion" in str(exc) else str(exc)[:200]
        raise _invalid(reason, param) from None
    _check_values(data, param)
    return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"the number {literal[:20]}... is out of range")
    return value


def _check_values(data: Any, root: str | None) -> None:
    """Depth and text checks over the whole value, iteratively (no recursion to exhaust)."""
    stack: list[tuple[Any, str | None, int]] = [(data, root, 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            if not _is_text(value):
                raise _surrogate(path)
        elif isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                raise _invalid(f"it nests deeper than {MAX_DEPTH} levels", root)
            if isinstance(value, list):
                stack.extend((item, f"{path or ''}[{index}]", depth + 1) for index, item in enumerate(value))
                continue
            for key, item in value.items():
                child = f"{path}.{key}" if path else key
                if not _is_text(key):
                    raise _surrogate(path)  # the key itself cannot be named
                stack.append((item, child, depth + 1))


def _is_text(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _invalid(reason: str, param: str | None) -> ApiError:
    return ApiError("invalid_json", f"The message is not valid JSON: {reason}.", param)


def _surrogate(param: str | None) -> ApiError:
    where = f"'{param}' holds" if param else "The message holds"
    return ApiError(
        "invalid_json", f"{where} a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), which is not text.", param
    )
