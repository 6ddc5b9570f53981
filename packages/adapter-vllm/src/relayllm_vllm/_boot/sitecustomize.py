"""Started through PYTHONPATH in vLLM's engine subprocesses (see relayllm_vllm.compat): hide the
torch extensions the parent found broken, then run the sitecustomize this file shadows."""

import importlib.machinery
import importlib.util
import os
import sys

_hidden = list(filter(None, os.environ.get("RELAYLLM_HIDE_MODULES", "").split(",")))
for _name in _hidden:
    sys.modules.setdefault(_name, None)
if "torchvision" in _hidden:  # transformers' torchvision-only modules vLLM imports: PIL's
    try:
        from relayllm_vllm.compat import install_pil_fallbacks

        install_pil_fallbacks()
    except ImportError:  # relayllm_vllm not importable here: nothing to serve
        pass

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["sitecustomize"] = _module
    _spec.loader.exec_module(_module)
