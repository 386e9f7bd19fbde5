"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}`.

One convention: `type` is the name of the exception class OpenAI's Python client raises for the status
(BadRequestError for 400, NotFoundError for 404, ...), and `code` is the HTTP status as an integer.
"""

from __future__ import annotations

import re

from pydantic import ValidationError
from starlette.responses import JSONResponse

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    409: "ConflictError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param)

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status in (429, 503) else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "APIError"), "param": param,
                      "code": status}}


def from_validation_error(e: ValidationError) -> APIError:
    """A pydantic error as a 400 naming the first offending field (`messages.0.role`)."""
    from tachyon.server.protocol import UNSUPPORTED

    errors = e.errors(include_url=False)
    err = errors[0]
    if err["type"] == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}")
    if err["type"] == "model_type" and not err["loc"]:
        return APIError(400, "the request body must be a JSON object")
    # Union members add their type to the location (`prompt.list[int].0`); keep the field path only.
    loc = [str(p) for p in err["loc"] if not re.fullmatch(r"(str|int|float|bool|list\[.*\]|dict\[.*\]|[A-Z]\w*)", str(p))]
    param = ".".join(loc) or None
    if err["type"] == "extra_forbidden":
        name = loc[-1] if loc else "?"
        why = UNSUPPORTED.get(name, "this server does not know this field")
        return APIError(400, f"{param}: {why}; remove it from the request (unsupported field)", param)
    value = err.get("input")
    shown = repr(value) if not isinstance(value, (dict, list)) or len(repr(value)) < 80 else type(value).__name__
    if len(shown) > 200:
        shown = shown[:200] + "..."
    return APIError(400, f"{param or 'body'}: {err['msg']} (got {shown})", param)


_FIELD = re.compile(r"SamplingParams\.(\w+)=")


def from_value_error(e: ValueError, names: dict[str, str] | None = None) -> APIError:
    """An InvalidRequestError (SamplingParams, LLMEngine.validate) as a 400 naming its field; `names` maps the
    engine's field names to the endpoint's (chat: logprobs -> top_logprobs)."""
    msg = str(e)
    param = getattr(e, "param", None)
    if param is None:
        m = _FIELD.search(msg)
        param = m.group(1) if m else None
    if names and param in names:
        param = names[param]
    return APIError(400, msg, param)
