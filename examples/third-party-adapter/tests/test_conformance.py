from relayllm.testing import BackendConformanceTests


class TestShoutConformance(BackendConformanceTests):
    backend = "shout"
    distribution = "relayllm-shout"
    options = {"suffix": "!!"}
