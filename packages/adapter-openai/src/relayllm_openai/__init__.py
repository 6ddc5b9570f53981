"""relayllm-openai: any OpenAI-compatible endpoint as a shared, rate-limited, retrying Serve
deployment (backend name ``openai``).

Importing this package is light: the ``openai`` client is imported only inside the deployment,
which runs in the Serve replica.
"""

from relayllm_openai.backend import OpenAIBackend
from relayllm_openai.options import OpenAIOptions

__version__ = "0.1.0"

__all__ = ["OpenAIBackend", "OpenAIOptions"]
