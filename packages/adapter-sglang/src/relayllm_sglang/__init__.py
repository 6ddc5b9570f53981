"""relayllm-sglang: an SGLang engine as a shared, named Ray Serve deployment.

Importing this package is light: sglang (and torch) load only inside the Serve replica.
"""

#: The sglang release this adapter is written and contract-tested against.
SGLANG_VERSION = "0.5.23"
#: What to install for the engine itself.
INSTALL_HINT = (
    "pip install './packages/adapter-sglang[engine]' (run in a clone of the relayllm repository)"
)

__version__ = "0.1.0"

__all__ = ["INSTALL_HINT", "SGLANG_VERSION", "__version__"]
