"""The error a request is refused with (SPEC §7 "Errors"): an HTTP status and the OpenAI error fields,
rendered as `{"error": {message, type, param, code}}`; and the two checks every validator starts with."""

from __future__ import annotations

from kern.errors import KernError

__all__ = ["ApiError", "is_int", "type_error"]


class ApiError(KernError):
    """A request the server refuses; carries the HTTP status and the OpenAI error fields."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __reduce__(self):  # pickled whole (serve/api/bodies.py's worker process raises them)
        return (ApiError, (self.status, self.message, self.param, self.code, self.type))


def is_int(v) -> bool:
    """A Python int, a bool not counted."""
    return isinstance(v, int) and not isinstance(v, bool)


def type_error(param: str, want: str, v) -> ApiError:
    return ApiError(400, f"'{param}' must be {want}, got {type(v).__name__}", param, "invalid_type")
