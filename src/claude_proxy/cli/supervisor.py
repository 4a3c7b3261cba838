"""The `--workers N` parent: uvicorn's supervisor, with the signals a team's proxy needs.

uvicorn's own parent replaces its workers one by one on SIGHUP (two configurations mixed for
seconds, and a broken file restarting them), and on SIGTERM stops them while its copy of the
socket still takes connections that nobody will answer. This parent passes SIGHUP on to every
worker, which reloads in place (server/reload.py); on SIGTERM it passes it on as uvicorn does
(each worker drains: server/drain.py) and closes its own copy of the socket when the workers
close theirs, DRAIN_DELAY later, so that a new connection is refused at once rather than left
waiting; then it waits for the workers to finish.

uvicorn.supervisors.Multiprocess is subclassed (its `handle_<signal>` methods), which is why
pyproject.toml pins uvicorn below its next minor version.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from socket import socket

import uvicorn
from uvicorn.supervisors import Multiprocess

logger = logging.getLogger("claude_proxy")


class Supervisor(Multiprocess):
    """uvicorn's Multiprocess, passing SIGHUP on and closing the socket after DRAIN_DELAY."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket], drain_delay: float) -> None:
        super().__init__(config, sockets)
        self.drain_delay = drain_delay

    def handle_hup(self) -> None:
        logger.info("SIGHUP: passed on to the %d workers, each reads the configuration again",
                    len(self.processes))
        for process in self.processes:
            if process.pid is not None and process.exitcode is None:
                os.kill(process.pid, signal.SIGHUP)

    def handle_term(self) -> None:
        logger.info("SIGTERM: the workers drain; the socket closes in %g s", self.drain_delay)
        closing = threading.Timer(self.drain_delay, self.close_sockets)
        closing.daemon = True
        closing.start()
        super().handle_term()

    def close_sockets(self) -> None:
        for sock in self.sockets:
            sock.close()


def run_workers(app: str, workers: int, drain_delay: float, **options: object) -> None:
    """uvicorn.run's --workers path, with the Supervisor as the parent."""
    config = uvicorn.Config(app, factory=True, workers=workers, **options)  # type: ignore[arg-type]
    sock = config.bind_socket()
    with contextlib.suppress(KeyboardInterrupt):
        Supervisor(config, [sock], drain_delay).run()
