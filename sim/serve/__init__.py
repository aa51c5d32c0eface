"""``sim serve``: the simulator behind an OpenAI-compatible HTTP endpoint, in real time.

:class:`~sim.serve.engine.LiveEngine` runs the simulated replicas (``replicas`` behind
``router``, as ``sim run``'s cluster) paced by the wall clock
(``time_scale`` wall seconds per simulated second); :func:`~sim.serve.app.make_app` is its
Starlette app (``/v1/completions``, ``/v1/chat/completions`` with streaming, ``/v1/models``,
``/health``, ``/metrics``); :func:`serve` runs both under uvicorn until SIGINT/SIGTERM, when
uvicorn stops accepting, lets the requests in flight finish (up to ``grace`` seconds) and the
engine stops. Needs the ``serve`` extra (``pip install 'llm-serving-sim[serve]'``).

May import: anything in ``sim`` but the CLI; only the CLI imports it (lazily: ``sim --help``
loads no Starlette, no uvicorn).
"""

from __future__ import annotations

__all__ = ["serve", "word_tokenizer"]


def word_tokenizer():
    """The folder of the word tokenizer (``sim/data/word_tokenizer``) benchmark clients load
    to count tokens as ``sim serve`` does: one token a whitespace-separated word (AIPerf's
    ``--tokenizer``, guidellm's ``--processor``)."""
    from importlib import resources
    return resources.files("sim").joinpath("data", "word_tokenizer")


def require_server():
    """``uvicorn`` (Starlette with it), or a ``ValueError`` naming the extra that installs them:
    checked before ``sim serve`` says it listens."""
    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        raise ValueError("sim serve needs Starlette and uvicorn: pip install "
                         "'llm-serving-sim[serve]'") from None
    return uvicorn


def serve(config, host="127.0.0.1", port=8000, time_scale=1.0, model="sim", grace=30.0,
          log_level="warning", max_concurrency=None):
    """Serve ``config`` (a ``SimConfig``) on ``host:port`` until SIGINT/SIGTERM, at most
    ``max_concurrency`` requests in flight (more: HTTP 429)."""
    uvicorn = require_server()
    from .app import make_app
    from .engine import LiveEngine

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            # uvicorn re-raises the signal once shut down (exit status -15); a shutdown asked
            # for is the end of the service, status 0
            getattr(self, "_captured_signals", []).clear()

    engine = LiveEngine(config, time_scale)
    Server(uvicorn.Config(make_app(engine, model, max_concurrency), host=host, port=port,
                          log_level=log_level, timeout_graceful_shutdown=grace)).run()
