"""A loopback fake of an OpenAI-compatible ``/v1/chat/completions`` endpoint, for judge-client tests.

Replies come from a script of ``(HTTP status, assistant text)`` pairs (then ``VERDICT: INCORRECT``);
every request's headers and JSON body are recorded.

Usage::

    with FakeJudge() as judge:
        judge.script = [(200, "VERDICT: CORRECT")]
        JudgeClient(judge.url, "m").judge(...)
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeJudge:
    """OpenAI-compatible chat endpoint on ``127.0.0.1:<free port>``; ``url`` ends in ``/v1``."""

    def __init__(self) -> None:
        self.script: list[tuple[int, str]] = []
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append((dict(self.headers), body | {"path": self.path}))
                status, text = fake.script.pop(0) if fake.script else (200, "VERDICT: INCORRECT")
                payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving and release the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> FakeJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
