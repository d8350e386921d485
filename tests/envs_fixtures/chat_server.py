"""A minimal OpenAI-compatible server for tests of our client side (the TextArena opponent behind a URL):
`GET /v1/models` and `POST /v1/chat/completions`, answered by a scripted policy in a thread of the test
process, on 127.0.0.1. It records each request's JSON body. What is under test is the client: what it
sends, how it reads replies and failures; a real model server would add minutes and nothing to that.

Left out: streaming, tools, authentication beyond recording the `Authorization` header.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


def lowest_listed_move(messages: list[dict]) -> str:
    """The scripted model: the lowest-numbered move the latest message lists ("Available Moves: '[3]', ...")."""
    listed = [line for line in str(messages[-1]["content"]).splitlines() if "Available Moves" in line]
    return min(re.findall(r"'(\[\d+\])'", listed[-1]), key=lambda move: int(move[1:-1]))


class ChatServer:
    """Serves `model` with `policy(messages) -> reply text`; `fail_completions` answers every completion
    with HTTP 500. Use as a context manager; `url` is the base URL a client takes (ending in /v1)."""

    def __init__(self, model: str = "scripted", policy: Callable[[list[dict]], str] = lowest_listed_move):
        self.model, self.policy = model, policy
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.fail_completions = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [
                        {"id": server.model, "object": "model", "created": 0, "owned_by": "tests"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                server.requests.append(body)
                server.headers.append(dict(self.headers))
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                if server.fail_completions:
                    return self._send(500, {"error": {"message": "the scripted model is down"}})
                if body.get("model") != server.model:
                    return self._send(404, {"error": {"message": f"model {body.get('model')!r} not found"}})
                text = server.policy(body["messages"])
                self._send(200, {"id": "chatcmpl-test", "object": "chat.completion", "created": 0,
                                 "model": server.model,
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": text}}],
                                 "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "ChatServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
