"""Run a loopback `socketserver` in a background thread, and stop it, one way for every fake."""

from __future__ import annotations

import socketserver
import threading


def serve_in_background(server: socketserver.BaseServer, name: str) -> threading.Thread:
    """Start ``server.serve_forever`` in a daemon thread named ``name``; return the thread."""
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True
    )
    thread.start()
    return thread


def stop_serving(server: socketserver.BaseServer | None, thread: threading.Thread | None) -> None:
    """Stop ``server`` (if any), close its socket and join its ``thread``."""
    if server is not None:
        server.shutdown()
        server.server_close()
    if thread is not None:
        thread.join(timeout=5)
