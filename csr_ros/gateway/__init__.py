"""`csr-ros gateway`: an OpenAI-compatible HTTP front door over the reconciler.

    session.py   pure: a client's prompt in, chunk appends / dynamic part / new version out
    service.py   sessions, each a CsrState and a Reconciler over its own pair of resources
    app.py       the HTTP adapter (starlette, served by uvicorn): /v1/chat/completions,
                 /v1/completions, /v1/models, /health, /v1/csr/sessions
"""
