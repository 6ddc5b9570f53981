"""Echo's simulated prefix cache: what routing is judged by, without an engine.

Per replica, an LRU of prompt blocks as an engine keeps them: a prompt's words (echo's tokens)
cut into blocks of ``block_words``, each block known by the hash of everything up to its end,
so a block hits only when the whole prefix before it is cached too, and only whole blocks are
cached (vLLM's CPU build: 128-token blocks). A row's lookup counts its prompt tokens as
queries, the words of its leading cached blocks as hits, and the rest as prefilled; the
replica reports them through the counters an engine's adapter feeds
(:meth:`relayllm.serving.metrics.ReplicaMetrics.add_prefix_cache` and ``add_engine_step``),
so ``relayllm status``, run summaries and the exported metrics read echo as they read vLLM.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict


class PrefixCache:
    """At most ``blocks`` blocks of ``block_words`` words, least recently used out first."""

    def __init__(self, blocks: int, block_words: int) -> None:
        self.blocks = blocks
        self.block_words = block_words
        self._lru: OrderedDict[bytes, None] = OrderedDict()

    def lookup(self, words: list[str]) -> int:
        """The words of ``words``' leading blocks found cached (its hits); every whole block
        of it is cached afterwards, as the engine computes them."""
        hits = 0
        missed = False
        digest = hashlib.blake2b(digest_size=16)
        size = self.block_words
        for start in range(0, len(words) - size + 1, size):
            digest.update("\x00".join(words[start : start + size]).encode() + b"\x01")
            block = digest.copy().digest()
            if not missed and block in self._lru:
                hits += size
                self._lru.move_to_end(block)
                continue
            missed = True
            self._lru[block] = None
            self._lru.move_to_end(block)
            while len(self._lru) > self.blocks:
                self._lru.popitem(last=False)
        return hits

    def reset(self) -> None:
        self._lru.clear()


__all__ = ["PrefixCache"]
