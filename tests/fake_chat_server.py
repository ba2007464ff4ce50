"""A real local OpenAI-compatible chat-completions server for tests, with scripted faults.

    server = FakeChatServer(faults={"tag-ep01": ["429:1", "ok"], "tag-ep02": ["500"]}, api_key="sk-test").start()
    ... base_url = server.url  (http://127.0.0.1:PORT/v1) ...
    server.prompt_counts[sha256(first user message's text)], server.request_counts[sha256(all messages)], server.log
    (each entry lists the sha256 of the images the first user message carried as OpenAI `image_url` data URLs)
    server.stop()

A fault script is keyed by a marker substring of the first user message; its items are used one per request for that
prompt, in arrival order, then "ok". Items:
    ok | fenced | trailing_comma | prose | malformed | missing_field | short_skill | placeholder   (HTTP 200 answers)
    bad_body (HTTP 200, body not JSON) | 429[:retry_after_s] | 500 | 401 | slow:S (sleep S s, then ok) | delay:S
`delay` (constructor) sleeps before every answer. `answer` (constructor): a function of the first user message's text
that returns the {"episode_summary", "episode_skill"} every answer is built from (default `good_answer`). Run
standalone: `python tests/fake_chat_server.py --delay 0.2`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def split_content(content) -> tuple[str, list[bytes]]:
    """A message's text and images: a plain string, or OpenAI content parts (text parts joined; each `image_url`
    part decoded from its base64 data URL)."""
    if isinstance(content, str):
        return content, []
    text, images = [], []
    for part in content or []:
        if part.get("type") == "text":
            text.append(part.get("text", ""))
        elif part.get("type") == "image_url":
            head, _, payload = part["image_url"]["url"].partition(",")
            if not head.startswith("data:image/") or not head.endswith(";base64"):
                raise ValueError("image_url is not a base64 data URL")
            images.append(base64.b64decode(payload, validate=True))
    return "".join(text), images


def messages_hash(messages: list[dict]) -> str:
    """Identity of one request: the whole conversation."""
    return sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False))


def good_answer(prompt: str) -> dict:
    m = re.search(r"^Task: (.*)$", prompt, re.MULTILINE)
    task = m.group(1).strip().rstrip(".") if m else "the task"
    return {
        "episode_summary": f"The agent worked on '{task}'. It moved between receptacles and acted on the object.",
        "episode_skill": f"To {task}, first find the object, take it, then place it in the target receptacle.",
    }


class FakeChatServer:
    def __init__(
        self,
        faults: dict[str, list[str]] | None = None,
        api_key: str | None = None,
        delay: float = 0.0,
        answer: Callable[[str], dict] | None = None,
    ):
        self.faults = {k: list(v) for k, v in (faults or {}).items()}
        self.answer = answer or good_answer
        self.api_key = api_key
        self.delay = delay
        self.prompt_counts: Counter[str] = Counter()
        self.request_counts: Counter[str] = Counter()
        self.marker_counts: Counter[str] = Counter()
        self.log: list[dict] = []
        self.lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FakeChatServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):  # noqa: N802 - http.server naming
                server._handle(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def __enter__(self) -> FakeChatServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def snapshot(self) -> Counter:
        with self.lock:
            return Counter(self.request_counts)

    # ------------------------------------------------------------------ requests
    def _next_fault(self, prompt: str, p_hash: str) -> tuple[str | None, str]:
        for marker, script in self.faults.items():
            if marker in prompt:
                i = self.marker_counts[marker]
                self.marker_counts[marker] += 1
                return marker, script[i] if i < len(script) else "ok"
        return None, "ok"

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length) or b"{}")
        if h.path.rstrip("/") != "/v1/chat/completions":
            return self._send(h, 404, {"error": {"message": f"no route {h.path}"}})
        messages = body.get("messages") or []
        try:  # as OpenAI's API, an image that is not a PNG/JPEG data URL is a 400
            split = [split_content(m.get("content")) for m in messages]
        except (ValueError, KeyError, binascii.Error) as exc:
            return self._send(h, 400, {"error": {"message": f"invalid image_url: {exc}"}})
        if any(not img.startswith((b"\x89PNG", b"\xff\xd8")) for _, imgs in split for img in imgs):
            return self._send(h, 400, {"error": {"message": "invalid image: not a PNG or JPEG"}})
        first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
        prompt, images = split[first_user] if first_user is not None else ("", [])
        p_hash, r_hash = sha256(prompt), messages_hash(messages)
        auth = h.headers.get("Authorization")
        with self.lock:
            self.prompt_counts[p_hash] += 1
            self.request_counts[r_hash] += 1
            marker, fault = self._next_fault(prompt, p_hash)
            if self.api_key is not None and auth != f"Bearer {self.api_key}":
                fault = "401"
            self.log.append(
                {
                    "t": time.monotonic(),
                    "prompt": p_hash,
                    "request": r_hash,
                    "marker": marker,
                    "fault": fault,
                    "turns": len(messages),
                    "images": [hashlib.sha256(img).hexdigest() for img in images],
                    "auth": auth is not None,
                    "model": body.get("model"),
                }
            )
        if self.delay:
            time.sleep(self.delay)
        kind, _, arg = fault.partition(":")
        if kind == "429":
            return self._send(h, 429, {"error": {"message": "rate limited"}}, {"Retry-After": arg or "1"})
        if kind == "500":
            return self._send(h, 500, {"error": {"message": "internal error"}})
        if kind == "401":
            # a server that echoes what it got must not make the client leak it
            return self._send(h, 401, {"error": {"message": f"invalid api key: {auth}"}})
        if kind == "bad_body":
            return self._send_raw(h, 200, b'{"choices": [ this is not json')
        if kind in ("slow", "delay"):
            time.sleep(float(arg or 2))
        answer = self.answer(prompt)
        if kind == "fenced":
            content = "Here is my analysis.\n```json\n" + json.dumps(answer, indent=2) + "\n```\nHope it helps."
        elif kind == "trailing_comma":
            content = json.dumps(answer, indent=2)[:-2] + ",\n}"
        elif kind == "prose":
            content = f"Episode summary: {answer['episode_summary']}\nEpisode skill: {answer['episode_skill']}"
        elif kind == "malformed":
            content = '{"episode_summary": "The agent tried", episode_skill: oops'
        elif kind == "missing_field":
            content = json.dumps({"episode_summary": answer["episode_summary"]})
        elif kind == "short_skill":
            content = json.dumps({"episode_summary": answer["episode_summary"], "episode_skill": "Be careful."})
        elif kind == "placeholder":
            content = json.dumps({"episode_summary": "<two sentences on what happened>", "episode_skill": "<the rule>"})
        else:
            content = json.dumps(answer)
        prompt_tokens = sum(len(text.split()) for text, _ in split) + 64 * sum(len(imgs) for _, imgs in split)
        reply = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(content.split()),
                "total_tokens": prompt_tokens + len(content.split()),
            },
        }
        self._send(h, 200, reply)

    def _send(self, h: BaseHTTPRequestHandler, status: int, payload: dict, headers: dict | None = None) -> None:
        self._send_raw(h, status, json.dumps(payload).encode(), headers)

    def _send_raw(self, h: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict | None = None) -> None:
        try:
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout) before the answer: that is the point of `slow`


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--api-key", default=None)
    args = ap.parse_args()
    srv = FakeChatServer(api_key=args.api_key, delay=args.delay).start()
    print(srv.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        srv.stop()
