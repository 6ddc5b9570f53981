"""The OpenAI Batch API as a service: the parts that need no cluster.

``ids`` (OpenAI-shaped ids), ``files`` (file bytes behind ``pyarrow.fs``), ``store`` (the
durable job store: files' metadata, batches, runner claims; its parts ``records``,
``store_protocol``, ``schema`` and ``claims``), ``validate`` (an input file checked before
anything runs), ``objects`` (store rows as OpenAI's JSON bodies) and ``keys`` (API keys to
projects). The gateway (HTTP) and the runner (claims; each batch a ``job``: processors,
resume) sit on top of these; nothing here imports Ray.
"""
