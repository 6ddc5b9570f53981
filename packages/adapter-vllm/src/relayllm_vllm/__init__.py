"""relayllm adapter for vllm (work in progress)."""
