"""relayllm's OpenAI Batch API service: ``relayllm serve`` and the commands that read it.

One subpackage per concern, each in the process it runs in: :mod:`~relayllm_service.store`
(the job store and the files' bytes, in every process), :mod:`~relayllm_service.tenancy`
(projects, keys, quotas, fair share, the usage ledger), :mod:`~relayllm_service.gateway` (the
Serve application's routes), :mod:`~relayllm_service.console` (the web page),
:mod:`~relayllm_service.runner` (the actor that runs batches) and :mod:`~relayllm_service.cli`
(the operator's commands, on the client's machine).
"""

__version__ = "0.1.0"
