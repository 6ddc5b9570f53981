"""generate -> score -> update -> generate: the loop of RL and evaluation jobs, on one shared
engine whose weights change between rounds (docs/control.md, "Weight updates").

Each round, the ``policy`` deployment (vLLM, the bundled demo model) samples a few answers to a
few questions; a reward scores them (the right city named, in few words); a trainer in this
process fine-tunes its copy of the model on the answers that scored above the round's mean
(rejection-sampling fine-tuning: a few optimizer steps on the model's final norm, which is cheap
on a CPU) and writes a checkpoint; ``relayllm.control("policy").update_weights`` loads it into
every replica as the next version. Every rollout row carries the ``weight_version`` that
produced it, so a round's rows can be told from the next round's.

    python examples/weight_loop.py --rounds 3

Needs ``relayllm-vllm[cpu]`` (or ``[gpu]``): the engine, and torch + transformers for the
trainer. Small on purpose: four questions, four samples each, 16 tokens.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import ray

import relayllm
from relayllm import ProcessorConfig, build_processor

DEPLOYMENT = relayllm.DeploymentConfig(
    name="policy",
    backend="vllm",
    options={"model": "demo", "max_model_len": 512, "max_num_seqs": 8},
    startup_timeout_s=1200,
)
#: (question, the word a good answer names)
QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of Japan?", "Tokyo"),
]
SAMPLES = 4  # rollouts per question and round
MAX_TOKENS = 16


def reward(row: dict[str, Any]) -> float:
    """1 for naming the right city, less a little per token: right and short is best."""
    right = QUESTIONS[row["question"]][1].lower() in (row["generated_text"] or "").lower()
    return float(right) - 0.01 * (row["num_generated_tokens"] or 0)


def generate(round_: int) -> list[dict[str, Any]]:
    """One round's rollouts: SAMPLES sampled answers per question, each with its reward."""
    rows = [
        {
            "question": q,
            "sample": s,
            "messages": [{"role": "user", "content": question}],
            # A seed per rollout and round: reproducible, and different every round.
            "sampling_params": {
                "temperature": 1.0,
                "max_tokens": MAX_TOKENS,
                "seed": 1000 * round_ + SAMPLES * q + s,
            },
        }
        for q, (question, _) in enumerate(QUESTIONS)
        for s in range(SAMPLES)
    ]
    processor = build_processor(ProcessorConfig(deployment=DEPLOYMENT.name, task="chat"))
    out = processor(ray.data.from_items(rows)).take_all()
    for row in out:
        row["reward"] = reward(row) if not row["error"] else None
    return out


class Trainer:
    """The trainer's copy of the policy (transformers, in this process): fine-tunes the final
    norm on the answers that scored above the mean and writes checkpoints vLLM can load."""

    def __init__(self, model_dir: str, lr: float = 1e-2) -> None:
        from relayllm_vllm.compat import hide_broken_torch_extensions

        hide_broken_torch_extensions(for_subprocesses=False)  # before transformers imports
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.source = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        for param in self.model.parameters():
            param.requires_grad_(False)
        self.trained = [self.model.model.norm.weight]  # backward stops right below it: cheap
        for param in self.trained:
            param.requires_grad_(True)
        self.optimizer = torch.optim.Adam(self.trained, lr=lr)

    def step(self, rollouts: list[dict[str, Any]], steps: int = 2) -> float:
        """A few optimizer steps on the rollouts above the round's mean reward; their loss."""
        scored = [r for r in rollouts if r["reward"] is not None]
        mean = sum(r["reward"] for r in scored) / max(len(scored), 1)
        kept = [r for r in scored if r["reward"] > mean] or scored
        batch = [self._example(r) for r in kept]
        loss = 0.0
        for _ in range(steps):
            self.optimizer.zero_grad()
            losses = [self._loss(ids, start) for ids, start in batch]
            total = self.torch.stack(losses).mean()
            total.backward()
            self.optimizer.step()
            loss = float(total.detach())
        return loss

    def _example(self, row: dict[str, Any]) -> tuple[Any, int]:
        text = self.tokenizer.apply_chat_template(
            row["messages"], add_generation_prompt=True, tokenize=False
        )
        prompt = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        answer = self.tokenizer(row["generated_text"] + "<|im_end|>", add_special_tokens=False)
        ids = self.torch.tensor([prompt + answer["input_ids"]])
        return ids, len(prompt)

    def _loss(self, ids: Any, start: int) -> Any:
        logits = self.model(ids).logits[0, start - 1 : -1]
        return self.torch.nn.functional.cross_entropy(logits, ids[0, start:])

    def save(self, directory: Path) -> str:
        """A checkpoint of the current weights (bfloat16, as the engine serves them)."""
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        state = {
            name: tensor.detach().to(self.torch.bfloat16).contiguous()
            for name, tensor in self.model.state_dict().items()
            if name != "lm_head.weight"  # tied to the embeddings: the checkpoint holds one
        }
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
        shutil.copy(self.source / "config.json", directory / "config.json")
        return str(directory)


def main(rounds: int = 3, work_dir: str | None = None) -> list[dict[str, Any]]:
    """Run the loop; one summary per round (its version, mean reward, rows)."""
    ref = relayllm.deploy(DEPLOYMENT)  # reused if it runs
    control = relayllm.control(ref.name)
    (info,) = control.replicas().values()
    trainer = Trainer(info["model_path"])
    work = Path(work_dir or tempfile.mkdtemp(prefix="weight-loop-"))
    control.update_weights(trainer.save(work / "round-0"), version=0)
    summary = []
    for round_ in range(rounds):
        rollouts = generate(round_)  # each row says which weights produced it
        versions = sorted({str(r["weight_version"]) for r in rollouts})
        rewards = [r["reward"] for r in rollouts if r["reward"] is not None]
        loss = trainer.step(rollouts)
        control.update_weights(trainer.save(work / f"round-{round_ + 1}"), version=round_ + 1)
        summary.append(
            {
                "round": round_,
                "weight_versions": versions,
                "rows": len(rollouts),
                "failed": sum(1 for r in rollouts if r["error"]),
                "mean_reward": round(sum(rewards) / max(len(rewards), 1), 3),
                "loss": round(loss, 3),
                "next_version": round_ + 1,
            }
        )
        print(json.dumps(summary[-1]), flush=True)
    if work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    main(parser.parse_args().rounds)
