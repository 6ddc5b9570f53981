"""The demo pipeline, shipped in code so ``relayllm demo`` works from an installed package.

It is ``examples/questions.yaml`` word for word (a test keeps the two identical).
"""

QUESTIONS_YAML = """\
# Common questions (the fundamental example): a chat model answers four questions, then a
# second step on the same deployment makes each answer shorter -- two processors, one engine.
#
# `relayllm demo` runs this file; so does `relayllm run examples/questions.yaml`. With no
# `output:` block the rows go to stdout as JSON lines (or use --output FILE).

deployments:
  - name: smollm
    backend: vllm
    options:
      model: demo   # the bundled SmolLM2-135M-Instruct; any HF model id or local path works
      # Rows the engine runs at once; the KV cache is sized from it (0.2 GiB here).
      # Raise it for big jobs: vLLM's CPU default, 256, takes 0.7 GiB for this model.
      max_num_seqs: 16

input:
  id_column: id
  rows:
    - {id: 1, question: "What is the capital of France?"}
    - {id: 2, question: "How many days are there in a week?"}
    - {id: 3, question: "What is the largest planet in our solar system?"}
    - {id: 4, question: "Who wrote Romeo and Juliet?"}

steps:
  - name: answer
    deployment: smollm
    messages:
      - role: system
        content: You are a helpful assistant. Answer in one or two sentences.
      - role: user
        content: "{question}"
    sampling_params: {temperature: 0.0, max_tokens: 64}
    output_column: answer

  - name: shorter
    deployment: smollm
    messages:
      - role: user
        content: "Make this answer shorter, ten words at most: {answer}"
    sampling_params: {temperature: 0.0, max_tokens: 32}
    output_column: short_answer
"""
