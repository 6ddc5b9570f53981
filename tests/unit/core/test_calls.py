"""calls.split_into_calls: count-based and token-budget grouping of a batch's rows."""

from relayllm.stage.calls import estimated_tokens, split_into_calls


def _rows(*lengths, max_tokens=None):
    params = {} if max_tokens is None else {"max_tokens": max_tokens}
    return [(i, {"prompt": "x" * n, "sampling_params": params}) for i, n in enumerate(lengths)]


def test_estimate_is_prompt_characters_over_four_plus_max_tokens():
    assert estimated_tokens({"prompt": "x" * 9}) == 3
    assert estimated_tokens({"prompt": ""}) == 1
    assert estimated_tokens({"prompt": "x" * 8, "sampling_params": {"max_tokens": 30}}) == 32
    chat = {"messages": [{"role": "user", "content": "x" * 40}], "sampling_params": {}}
    assert estimated_tokens(chat) == 10


def test_without_a_budget_calls_are_batch_size_rows():
    calls = split_into_calls(_rows(*[4000] * 10), 4, None)
    assert [len(c) for c in calls] == [4, 4, 2]


def test_budget_closes_a_call_before_it_passes():
    # 40 characters = 10 tokens each, + max_tokens 10 = 20 per row; budget 50 -> 2 per call.
    calls = split_into_calls(_rows(*[40] * 5, max_tokens=10), 8, 50)
    assert [[i for i, _ in c] for c in calls] == [[0, 1], [2, 3], [4]]


def test_budget_and_batch_size_both_bound_a_call():
    calls = split_into_calls(_rows(*[4] * 10), 4, 10_000)
    assert [len(c) for c in calls] == [4, 4, 2]


def test_a_row_over_the_budget_travels_alone_and_is_not_dropped():
    calls = split_into_calls(_rows(4, 4000, 4), 8, 100)
    assert [[i for i, _ in c] for c in calls] == [[0], [1], [2]]
