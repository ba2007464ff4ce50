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
import re
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


CONTEXT_WORDS = re.compile(r"context length|context window|maximum context|max_model_len|too long", re.I)


def error_message(detail: str) -> str:
    """The cause a server gives in an error body (OpenAI / vLLM: {"error": {"message"}}; some: {"message"}), one line."""
    try:
        data = orjson.loads(detail)
    except orjson.JSONDecodeError:
        return " ".join(detail.split())[:300] or "no detail"
    if isinstance(data, dict):
        err = data.get("error", data)
        message = err.get("message") if isinstance(err, dict) else err
        if message:
            return " ".join(str(message).split())[:300]
    return " ".join(detail.split())[:300] or "no detail"


class _ContextOverflow(Exception):
    """HTTP 400: prompt + max_tokens exceed the server's context; carries the figures the server gave."""

    def __init__(self, message: str, context: int | None, prompt_tokens: int | None):
        super().__init__(message)
        self.context = context
        self.prompt_tokens = prompt_tokens

    @classmethod
    def parse(cls, cause: str) -> _ContextOverflow | None:
        context = re.search(r"(?:maximum context length is|context length \(?)\s*(\d+)", cause)
        prompt = re.search(
            r"(\d+) (?:tokens )?in the messages|prompt contains (?:at least )?(\d+) input tokens|"
            r"Input length \((\d+)\)|(\d+) (?:input|prompt) tokens",
            cause,
        )
        ctx = int(context.group(1)) if context else None
        n = next((int(g) for g in prompt.groups() if g), None) if prompt else None
        if ctx and n and n >= ctx:
            message = (
                f"HTTP 400: the analysis prompt has {n} tokens, more than the server's context of {ctx} "
                f"(its max_model_len); serve the model with a longer --max-model-len or shorten the prompt"
            )
        else:
            message = f"HTTP 400: {cause}"
        return cls(message, ctx, n)


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
        # a key is required by the glm preset, or when the user named a variable other than the preset's; a local
        # OpenAI-compatible server (vLLM, SGLang) takes none
        explicit_env = api_key_env is not None and api_key_env != PRESETS[analyzer].api_key_env
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
        self._context: int | None = None  # the server's max_model_len, read once from /models where it says
        self._context_read = False
        self._context_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ChatClient({self.name!r}, base_url={self.base_url!r}, model={self.model!r}, key=${self.api_key_env})"

    def _scrub(self, text: str) -> str:
        return text.replace(self.__key, "***") if self.__key else text

    def close(self) -> None:
        pass

    def analyze(self, messages: list[dict], trajectory=None) -> AnalyzerResponse:  # noqa: ARG002 - common interface
        return self.chat(messages)

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "seedcli"}
        if self.__key:
            headers["Authorization"] = f"Bearer {self.__key}"
        return headers

    def server_context(self) -> int | None:
        """The served model's context length from `GET /models` (`max_model_len`, as vLLM reports it), read once;
        None when the server does not say (OpenAI) or cannot be asked."""
        with self._context_lock:
            if not self._context_read:
                self._context_read = True
                self._context = self._read_context()
            return self._context

    def _read_context(self) -> int | None:
        req = urllib.request.Request(self.base_url + "/models", headers=self._headers(), method="GET")
        try:
            with urllib.request.urlopen(req, timeout=min(self.timeout, 10.0)) as resp:
                data = orjson.loads(resp.read())
        except Exception:  # noqa: BLE001 - optional information: the request itself reports real problems
            return None
        entries = data.get("data") if isinstance(data, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and entry.get("id") == self.model:
                value = entry.get("max_model_len") or entry.get("context_length")
                return int(value) if isinstance(value, (int, float)) and value > 0 else None
        return None

    def _body(self, messages: list[dict], max_tokens: int) -> bytes:
        return orjson.dumps(
            {
                "model": self.model,
                "messages": messages,
                "temperature": self.temperature,
                "max_tokens": max_tokens,
                "stream": False,
            }
        )

    def chat(self, messages: list[dict]) -> AnalyzerResponse:
        """One completion, retried on transient failures. Raises AuthError (stop the stage), UserError (a wrong URL
        or model: stop the stage) or RequestFailed (give up on this record). Never asks for more tokens than the
        server's context holds: max_tokens is capped at its max_model_len, and when the server says how long the
        prompt is, at what is left after it."""
        context = self.server_context()
        max_tokens = min(self.max_tokens, context - 1) if context else self.max_tokens
        body = self._body(messages, max_tokens)
        headers = self._headers()
        t0 = time.monotonic()
        retries = 0
        refitted = False
        while True:
            try:
                return self._once(body, headers, retries, t0)
            except _ContextOverflow as exc:
                limit = exc.context or context
                room = (limit - exc.prompt_tokens) if (limit and exc.prompt_tokens) else 0
                if refitted or room < 1:
                    raise RequestFailed(str(exc), retries, time.monotonic() - t0) from None
                refitted = True  # the server counted the prompt: ask again for no more than what fits after it
                body = self._body(messages, min(max_tokens, room))
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
            cause = error_message(detail)
            if status == 400 and CONTEXT_WORDS.search(cause):
                overflow = _ContextOverflow.parse(cause)
                if overflow is not None:
                    raise overflow from None
            raise RequestFailed(f"HTTP {status} from {self.url}: {cause}", retries, time.monotonic() - t0) from None
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
