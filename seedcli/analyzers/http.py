"""OpenAI-compatible chat-completions client (standard library only) with the `glm` and `openai` presets.

- glm: Z.ai's OpenAI-compatible endpoint (https://api.z.ai/api/paas/v4, model `glm-5.2`, key in $ZAI_API_KEY).
- openai: any OpenAI-compatible server — OpenAI, `vllm serve`, SGLang; `--base-url` (ending in /v1) and `--model`
  are required; the key ($OPENAI_API_KEY by default) is optional, since local servers usually take none.

One request per call of `chat`, safe to call from many threads (the stage bounds how many are in flight). Transient
failures — 429, 5xx, connection errors, timeouts, a body that is not JSON — are retried with exponential back-off and
jitter, never sooner than the server's Retry-After. 401/403 raise `AuthError` (a UserError: the stage stops at
once, exit 2). The API key lives only in this object's request headers: it is never in a repr, an error or a record.
"""

from __future__ import annotations

import email.utils
import http.client
import os
import random
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import orjson

from seedcli.analyzers import AnalyzerResponse
from seedcli.errors import UserError


@dataclass(frozen=True)
class Preset:
    base_url: str | None
    model: str | None
    api_key_env: str
    key_required: bool


PRESETS: dict[str, Preset] = {
    # Z.ai's general (pay-as-you-go) OpenAI-compatible endpoint; GLM Coding Plan users pass
    # --base-url https://api.z.ai/api/coding/paas/v4 instead.
    "glm": Preset("https://api.z.ai/api/paas/v4", "glm-5.2", "ZAI_API_KEY", key_required=True),
    "openai": Preset(None, None, "OPENAI_API_KEY", key_required=False),
}

RETRYABLE_STATUS = {408, 409, 425, 429}  # plus every 5xx
BACKOFF_MAX_S = 60.0
RETRY_AFTER_MAX_S = 600.0


class AuthError(UserError):
    """401/403: retrying would fail the same way for every record."""


class RequestFailed(Exception):
    """One request failed for good (retries exhausted, or a 4xx other than 401/403/404): the record is rejected."""

    def __init__(self, message: str, retries: int, latency_s: float):
        super().__init__(message)
        self.retries = retries
        self.latency_s = latency_s


class _Transient(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def resolve(analyzer: str, base_url: str | None, model: str | None, api_key_env: str | None) -> tuple[str, str, str]:
    """Preset defaults filled in: (base_url, model, api_key_env); a one-line UserError when one is missing."""
    preset = PRESETS[analyzer]
    base_url = base_url or preset.base_url
    model = model or preset.model
    if not base_url:
        raise UserError(f"--analyzer {analyzer} needs --base-url (e.g. http://127.0.0.1:8000/v1 for `vllm serve`)")
    if not model:
        raise UserError(f"--analyzer {analyzer} needs --model (the model name the server serves)")
    return base_url.rstrip("/"), model, api_key_env or preset.api_key_env


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff_delay(retry: int, base: float, retry_after: float | None = None, rng: random.Random | None = None) -> float:
    """Exponential back-off with jitter (uniform in [cap/2, cap], cap = base·2^retry ≤ 60 s), but never sooner than
    the server's Retry-After."""
    rng = rng or random
    cap = min(BACKOFF_MAX_S, base * (2**retry))
    delay = rng.uniform(0.5 * cap, cap)  # jitter spreads a burst of 429s; the floor keeps the back-off exponential
    if retry_after is not None:
        delay = max(delay, min(retry_after, RETRY_AFTER_MAX_S))
    return delay


class ChatClient:
    """A chat-completions endpoint. `chat(messages)` returns the answer text with token usage and latency."""

    name = "http"
    batched = False

    def __init__(
        self,
        analyzer: str,
        base_url: str | None = None,
        model: str | None = None,
        api_key_env: str | None = None,
        *,
        timeout: float = 120.0,
        max_retries: int = 6,
        temperature: float = 0.0,
        max_tokens: int = 4096,
        backoff: float = 1.0,
        stop: threading.Event | None = None,
    ):
        if analyzer not in PRESETS:
            raise UserError(f"unknown HTTP analyzer '{analyzer}'; use one of {', '.join(PRESETS)}")
        self.name = analyzer
        explicit_env = api_key_env is not None
        self.base_url, self.model, self.api_key_env = resolve(analyzer, base_url, model, api_key_env)
        key = os.environ.get(self.api_key_env, "").strip()
        if not key and (PRESETS[analyzer].key_required or explicit_env):
            raise UserError(
                f"--analyzer {analyzer}: ${self.api_key_env} is not set; export the API key in it "
                f"or name another variable with --api-key-env"
            )
        self.__key = key  # name-mangled and absent from repr: keep it out of every log and error
        self.timeout = timeout
        self.max_retries = max_retries
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.backoff = backoff
        self.stop = stop or threading.Event()
        self.url = self.base_url + "/chat/completions"

    def __repr__(self) -> str:
        return f"ChatClient({self.name!r}, base_url={self.base_url!r}, model={self.model!r}, key=${self.api_key_env})"

    def _scrub(self, text: str) -> str:
        return text.replace(self.__key, "***") if self.__key else text

    def close(self) -> None:
        pass

    def analyze(self, messages: list[dict], trajectory=None) -> AnalyzerResponse:  # noqa: ARG002 - common interface
        return self.chat(messages)

    def chat(self, messages: list[dict]) -> AnalyzerResponse:
        """One completion, retried on transient failures. Raises AuthError (stop the stage), UserError (a wrong URL
        or model: stop the stage) or RequestFailed (give up on this record)."""
        body = orjson.dumps(
            {
                "model": self.model,
                "messages": messages,
                "temperature": self.temperature,
                "max_tokens": self.max_tokens,
                "stream": False,
            }
        )
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "seedcli"}
        if self.__key:
            headers["Authorization"] = f"Bearer {self.__key}"
        t0 = time.monotonic()
        retries = 0
        while True:
            try:
                return self._once(body, headers, retries, t0)
            except _Transient as exc:
                if retries >= self.max_retries or self.stop.is_set():
                    raise RequestFailed(
                        f"{self._scrub(str(exc))} (gave up after {retries} retries)", retries, time.monotonic() - t0
                    ) from None
                delay = backoff_delay(retries, self.backoff, exc.retry_after)
                retries += 1
                if self.stop.wait(delay):
                    raise RequestFailed("stopped: the stage is shutting down", retries, time.monotonic() - t0) from None

    def _once(self, body: bytes, headers: dict, retries: int, t0: float) -> AnalyzerResponse:
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            status = exc.code
            try:
                detail = exc.read().decode("utf-8", "replace")[:300]
            except Exception:  # noqa: BLE001 - the body is only a hint
                detail = ""
            detail = self._scrub(" ".join(detail.split()))
            if status in (401, 403):
                raise AuthError(
                    f"authentication failed for {self.base_url} (HTTP {status}): check ${self.api_key_env}"
                ) from None
            if status == 404:
                raise UserError(
                    f"{self.url}: HTTP 404 ({detail or 'not found'}); check --base-url (OpenAI-compatible servers "
                    f"end in /v1) and --model {self.model}"
                ) from None
            if status in RETRYABLE_STATUS or status >= 500:
                raise _Transient(
                    f"HTTP {status}: {detail}", parse_retry_after(exc.headers.get("Retry-After"))
                ) from None
            raise RequestFailed(f"HTTP {status}: {detail}", retries, time.monotonic() - t0) from None
        except TimeoutError:
            raise _Transient(f"no answer within {self.timeout:g} s") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise _Transient(f"no answer within {self.timeout:g} s") from None
            raise _Transient(f"connection error: {self._scrub(str(exc.reason))}") from None
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            raise _Transient(f"connection error: {type(exc).__name__}: {self._scrub(str(exc))}") from None
        try:
            data = orjson.loads(raw)
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            raise _Transient(
                f"malformed response body: {self._scrub(raw[:120].decode('utf-8', 'replace'))!r}"
            ) from None
        usage = data.get("usage") or {}
        return AnalyzerResponse(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            latency_s=time.monotonic() - t0,
            retries=retries,
            finish_reason=str(choice.get("finish_reason") or "stop"),
        )
