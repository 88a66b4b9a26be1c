"""How an OpenAI-compatible server's refusals become the errors of csr_ros.errors.

    what the server said                         raised
    a prompt too long ("context" and "length"    ContextOverflowError
      or "window" in its message)
    HTTP 401 / 403                               ResourceUnavailableError: the API key
    HTTP 404                                     ResourceUnavailableError: wrong model or not
                                                 an OpenAI-compatible server
    HTTP 5xx                                     ResourceUnavailableError: the server failed
    any other status, an `error` in a body       ResourceError: the request was rejected

What the connection does (no connection, a timeout, a stream that breaks) is mapped where it
happens, in http_transport.py.
"""

from __future__ import annotations

from csr_ros.errors import (ContextOverflowError, CsrError, ResourceError,
                            ResourceUnavailableError)

API_KEY_ENV = "CSR_ROS_API_KEY"


def error_from_status(status: int, detail: str, url: str) -> CsrError:
    detail = detail.strip()[:500]
    if "context" in detail.lower() and ("length" in detail.lower() or "window" in detail.lower()):
        return ContextOverflowError(f"{url} refused the prompt as too long: {detail}")
    if status in (401, 403):
        return ResourceUnavailableError(f"{url} refused the API key (HTTP {status}): set "
                                        f"api_key= or ${API_KEY_ENV}")
    if status == 404:
        return ResourceUnavailableError(f"{url}: not found (HTTP 404; wrong model or not an "
                                        f"OpenAI-compatible server): {detail}")
    if status >= 500:
        return ResourceUnavailableError(f"{url} failed (HTTP {status}): {detail}")
    return ResourceError(f"{url} rejected the request (HTTP {status}): {detail}")


def error_from_body(payload: dict, url: str) -> CsrError:
    """The error a server put in a JSON body (or a streamed event) that came with HTTP 200."""
    error = payload.get("error")
    detail = error.get("message", str(error)) if isinstance(error, dict) else str(error)
    return error_from_status(400, detail, url)
