"""The operator's commands (``relayllm serve``, ``unserve``, ``batches``, ``files``,
``usage``), registered through the ``relayllm_register_commands`` hook.
"""
