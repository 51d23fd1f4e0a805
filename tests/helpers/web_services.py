"""Stand-ins of the hosted web services (Serper, Semantic Scholar, Jina Reader, a Crawl4AI server) on 127.0.0.1,
and the reply shapes of their APIs, for the web tool tests.

`web_stub_server()` serves one `WebStub`: replies scripted per path prefix, every request recorded.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KEYS = {"SERPER_API_KEY": "serper-key", "S2_API_KEY": "s2-key", "JINA_API_KEY": "jina-key"}
CRAWL4AI_KEY = "crawl-key"


class WebStub:
    """Replies scripted per path prefix (the last one of a script repeats); every request is recorded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.scripts: dict[str, list[tuple[int, object, float]]] = {}
            self.requests: list[dict] = []
            self.active = self.max_active = 0

    def script(self, prefix: str, *replies: tuple[int, object, float] | tuple[int, object]) -> None:
        with self.lock:
            self.scripts[prefix] = [(*reply, 0.0)[:3] for reply in replies]

    def next_reply(self, path: str) -> tuple[int, object, float]:
        with self.lock:
            prefix = max((p for p in self.scripts if path.startswith(p)), key=len, default=None)
            if prefix is None:
                return 404, {"message": "no such route"}, 0.0
            queue = self.scripts[prefix]
            return queue.pop(0) if len(queue) > 1 else queue[0]


class _Handler(BaseHTTPRequestHandler):
    stub: WebStub

    def _answer(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        stub = self.stub
        with stub.lock:
            stub.requests.append(
                {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
            )
            stub.active += 1
            stub.max_active = max(stub.max_active, stub.active)
        status, payload, delay = stub.next_reply(self.path)
        time.sleep(delay)
        with stub.lock:
            stub.active -= 1
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/html" if isinstance(payload, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
            pass

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@contextmanager
def web_stub_server() -> Iterator[tuple[WebStub, str]]:
    """A started stand-in and its base URL; shut down afterwards."""
    stub = WebStub()
    handler = type("Handler", (_Handler,), {"stub": stub})
    web = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        yield stub, f"http://127.0.0.1:{web.server_address[1]}"
    finally:
        web.shutdown()


S2_REPLY = {
    "data": [
        {
            "score": 0.61,
            "snippet": {
                "text": "Attention is all you need.",
                "snippetKind": "body",
                "section": "Abstract",
                "snippetOffset": {"start": 0, "end": 26},
            },
            "paper": {"corpusId": "13756489", "title": "Attention Is All You Need", "authors": []},
        },
        {"score": 0.4, "snippet": {"text": "", "snippetKind": "title"}, "paper": {"corpusId": "1"}},
        {
            "score": 0.3,
            "snippet": {"text": "Transformers replace recurrence.  ", "snippetKind": "body"},
            "paper": {"corpusId": "2"},
        },
    ],
    "retrievalVersion": "pa1-v1",
}


def jina_page(title: str, content: str) -> dict:
    data = {"title": title, "description": "", "url": "https://example.com/", "content": content}
    return {"code": 200, "status": 20000, "data": {**data, "usage": {"tokens": 9}}, "meta": {"usage": {"tokens": 9}}}


def crawl_reply(**page) -> dict:
    result = {"url": "https://example.com/", "success": True, "status_code": 200, "html": "<p>x</p>"} | page
    return {"success": True, "results": [result], "server_processing_time_s": 0.8}
