"""relayllm adapter for sglang (work in progress)."""
