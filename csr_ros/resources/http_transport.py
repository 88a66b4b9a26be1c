"""HTTP to one OpenAI-compatible server: requests, retries, streamed events, errors.

httpx: one client for sync and async code, streaming responses read line by line, separate
connect and read timeouts, connection pooling, and a maintained, typed code base. Only the
synchronous client is used here. `trust_env=False`: a proxy variable in the environment must
not reroute traffic meant for a server on this host.

Retries: only when the connection cannot be made (connect errors and connect/pool timeouts),
with exponential backoff, because then the server provably never saw the request. A request
that failed mid-way is reported (ResourceUnavailableError / ResourceTimeoutError) and the
caller decides: a query is late already.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Callable, Iterator

import httpx

from csr_ros.errors import ResourceError, ResourceTimeoutError, ResourceUnavailableError
from csr_ros.resources.http_errors import API_KEY_ENV, error_from_body, error_from_status

log = logging.getLogger(__name__)
# httpx logs every request at INFO; at 2 Hz and more that buries everything else.
logging.getLogger("httpx").setLevel(logging.WARNING)


class HttpTransport:
    """One server's base URL, its API key (`api_key`, else $CSR_ROS_API_KEY) and a pooled
    client. `name` is the resource's, for messages."""

    def __init__(self, url: str, *, name: str, api_key: str | None = None,
                 connect_timeout_s: float = 5.0, read_timeout_s: float = 300.0,
                 retries: int = 2, backoff_s: float = 0.5,
                 transport: httpx.BaseTransport | None = None):
        self.url = url.rstrip("/")
        self.name = name
        self.api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        self.retries = retries
        self.backoff_s = backoff_s
        self.connect_timeout_s = connect_timeout_s
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.client = httpx.Client(base_url=self.url, headers=headers, trust_env=False,
                                   timeout=httpx.Timeout(read_timeout_s,
                                                         connect=connect_timeout_s),
                                   transport=transport)

    def post(self, path: str, body: dict, *, stream: bool, headers: dict | None = None,
             read_timeout_s: float | None = None) -> httpx.Response:
        """POST `body` as JSON; retried only while no connection could be made. A status
        other than 200 is raised as the error it maps to (http_errors.py). `read_timeout_s`
        replaces the client's read timeout for this request."""
        timeout = httpx.USE_CLIENT_DEFAULT if read_timeout_s is None else \
            httpx.Timeout(read_timeout_s, connect=self.connect_timeout_s)
        request = self.client.build_request("POST", path, json=body, headers=headers,
                                            timeout=timeout)
        for attempt in range(self.retries + 1):
            try:
                response = self.client.send(request, stream=stream)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                if attempt == self.retries:
                    msg = (f"{self.name}: cannot reach {self.url} after {attempt + 1} attempts "
                           f"({type(exc).__name__}: {exc})")
                    raise ResourceUnavailableError(msg) from None
                delay_s = self.backoff_s * 2 ** attempt
                log.warning("%s: %s unreachable (%s); retrying in %.1f s", self.name, self.url,
                            type(exc).__name__, delay_s)
                time.sleep(delay_s)
            except httpx.TimeoutException as exc:
                raise ResourceTimeoutError(f"{self.name}: {self.url} did not answer in time "
                                           f"({type(exc).__name__})") from None
            except httpx.HTTPError as exc:
                msg = f"{self.name}: request to {self.url} failed ({type(exc).__name__}: {exc})"
                raise ResourceUnavailableError(msg) from None
        if response.status_code != 200:
            try:
                detail = response.read().decode("utf-8", errors="replace")
            finally:
                response.close()
            raise error_from_status(response.status_code, detail, self.url)
        return response

    def complete(self, path: str, body: dict, *, headers: dict | None = None,
                 read_timeout_s: float | None = None) -> dict:
        """A non-streamed answer's JSON body; an error the server put in it is raised."""
        response = self.post(path, body, stream=False, headers=headers,
                             read_timeout_s=read_timeout_s)
        try:
            payload = json.loads(response.read())
        except httpx.TimeoutException:
            raise ResourceTimeoutError(f"{self.url} did not finish the answer in time") from None
        except httpx.HTTPError as exc:
            msg = f"the answer from {self.url} broke off ({exc})"
            raise ResourceUnavailableError(msg) from None
        except json.JSONDecodeError as exc:
            msg = f"{self.url} answered something that is not JSON: {exc}"
            raise ResourceError(msg) from None
        finally:
            response.close()
        if "error" in payload:
            raise error_from_body(payload, self.url)
        return payload

    def events(self, response: httpx.Response, *,
               n_received: Callable[[], int]) -> Iterator[dict]:
        """Server-sent events of one streamed answer, until `data: [DONE]`."""
        try:
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue                      # blank separators, ": ping" comments
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise error_from_body(event, self.url)
                yield event
        except httpx.TimeoutException:
            msg = (f"{self.name}: {self.url} went silent mid-stream after {n_received()} "
                   "streamed pieces")
            raise ResourceTimeoutError(msg) from None
        except httpx.HTTPError as exc:
            msg = (f"{self.name}: the stream from {self.url} broke after {n_received()} "
                   f"streamed pieces ({type(exc).__name__}: {exc}); the server may have died")
            raise ResourceUnavailableError(msg) from None
        except json.JSONDecodeError as exc:
            raise ResourceError(f"{self.name}: {self.url} sent a malformed event: {exc}") from None
        msg = f"{self.name}: the stream from {self.url} ended without [DONE]"
        raise ResourceUnavailableError(msg)

    def get_json(self, path: str, *, what: str, missing_ok: bool = False) -> dict | None:
        """GET `path` as JSON; None where `missing_ok` and the server has no such endpoint."""
        try:
            response = self.client.get(path)
        except httpx.TimeoutException as exc:
            raise ResourceTimeoutError(f"{self.url}{path}: no answer in time ({exc})") from None
        except httpx.HTTPError as exc:
            msg = (f"{self.name}: cannot reach {self.url} to {what} ({type(exc).__name__}: "
                   f"{exc}). Is the server running? On this machine: "
                   "`csr-ros serve llamacpp --port 8001`; on a GPU server: "
                   "`csr-ros serve vllm --config config/vllm.yaml`")
            raise ResourceUnavailableError(msg) from None
        if response.status_code in (401, 403):
            msg = (f"{self.url} refused the API key (HTTP {response.status_code}): "
                   f"set api_key= or ${API_KEY_ENV}")
            raise ResourceUnavailableError(msg)
        if response.status_code != 200:
            if missing_ok:
                return None
            raise error_from_status(response.status_code, response.text, self.url)
        try:
            return response.json()
        except json.JSONDecodeError:
            if missing_ok:
                return None
            raise ResourceUnavailableError(f"{self.url}{path} did not answer JSON") from None

    def close(self) -> None:
        self.client.close()
