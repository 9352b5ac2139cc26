"""A webhook receiver on 127.0.0.1 that records every call and fails every `fail_every`-th
(answers 500): what `bench webhooks` and the service tests post drain warnings to."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Receiver:
    fail_every: int = 0
    calls: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        if self.server is None:
            raise RuntimeError("the receiver is not started")
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def start(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    n = len(receiver.calls) + 1
                    fail = bool(receiver.fail_every) and n % receiver.fail_every == 0
                    receiver.calls.append(
                        {
                            "at": time.time(),
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                            "ok": not fail,
                        }
                    )
                self.send_response(500 if fail else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:  # noqa: ANN002 - http.server's signature
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
