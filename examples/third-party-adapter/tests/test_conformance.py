from relayllm.testing import BackendConformanceTests


class TestShoutConformance(BackendConformanceTests):
    backend = "shout"
    distribution = "relayllm-shout"
    options = {"suffix": "!!"}
    context_length = 100  # a longer prompt is refused: the kit checks it fails alone
    engine_down_untestable = "shout has no engine process a test could stop"
    greedy_only = "shout has one answer per prompt, whatever the temperature"
