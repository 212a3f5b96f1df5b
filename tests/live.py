"""A real server for tests that need sockets: uvicorn on a free loopback port, in a thread of this process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI


@contextmanager
def live_server(app: FastAPI, lifespan: bool = True, timeout: float = 60.0,
                log_level: str = "warning") -> Iterator[str]:
    """Serve `app` and yield its base URL once it listens (after its lifespan started the models, if `lifespan`).

    With `lifespan=False` the app's lifespan is left to whoever runs it already (a TestClient sharing the app).
    """
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on" if lifespan else "off",
                                           log_level=log_level))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
