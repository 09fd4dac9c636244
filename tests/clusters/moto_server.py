"""moto's S3 (and DynamoDB, ...) API server in a process of its own, for the object-store
tests: ``python -m clusters.moto_server [--port N] [--ignore-conditional-writes]``.

It prints ``listening on http://127.0.0.1:PORT`` once it accepts connections (port 0: the
kernel picks a free one, so there is no race for it). ``--ignore-conditional-writes`` drops
the ``If-None-Match`` and ``If-Match`` headers of every request before moto sees them: a store
without conditional writes, the negative control of the concurrent-commit tests (delta-rs
relies on ``If-None-Match: *`` alone to keep two writers from committing the same version).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterable
from typing import Any

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def without_conditional_writes(app: WSGIApp) -> WSGIApp:
    def handle(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        environ.pop("HTTP_IF_NONE_MATCH", None)
        environ.pop("HTTP_IF_MATCH", None)
        return app(environ, start_response)

    return handle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ignore-conditional-writes", action="store_true")
    parser.add_argument("--access-log", action="store_true", help="log every request")
    args = parser.parse_args()
    if not args.access_log:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app: WSGIApp = DomainDispatcherApplication(create_backend_app)
    if args.ignore_conditional_writes:
        app = without_conditional_writes(app)
    server = make_server(
        args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler
    )
    print(f"listening on http://{args.host}:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
