"""One HTTP layer for both of relayllm's servers: a deployment's OpenAI-compatible front
(:mod:`relayllm.serving.http_front`) and the Batch API gateway
(:mod:`relayllm_service.gateway.app`) are route sets on it.

- :mod:`~relayllm.http.errors`: OpenAI's error envelope, the one way a request is refused.
- :mod:`~relayllm.http.auth`: bearer key -> project, with two providers (a deployment's single
  key here, the batch service's key map in :mod:`relayllm_service.tenancy.keys`).
- :mod:`~relayllm.http.app`: routes declared with Starlette's ``Router``, the JSON body reader,
  root-path handling, and one dispatch for Serve's replicas and the direct server.
- :mod:`~relayllm.http.host`: what the front needs of the replica it serves (a Protocol both
  the replica and the gateway implement).
- :mod:`~relayllm.http.server`: the direct uvicorn server, with flow control on bodies.

Starlette and uvicorn come with ``ray[serve]``; they are imported where a server is built,
never by ``import relayllm``.
"""
