"""The conformance kit: what every adapter must do, inherited in a few lines.

    from relayllm.testing import BackendConformanceTests

    class TestMyBackend(BackendConformanceTests):
        backend = "my-backend"
        distribution = "relayllm-my-backend"   # whose entry point registers it
        options = {"model": "...", "max_model_len": 512}
        context_length = 512                   # how to make the engine refuse one row

        def stop_engine(self, ref):            # or: engine_down_untestable = "<why>"
            ...

It runs the engine-free checks of :class:`~relayllm.testing.BackendContractTests` and these,
against one deployment of the backend (class scope, shared by the tests). They check the
adapter, not core: rows go through the real stage or straight to the deployment's
``process_batch``, and every assertion is about what the engine answered. By area:

- :mod:`~relayllm.testing.kit.tasks`: ``test_health_and_info``;
  ``test_each_row_gets_its_own_answer`` (rows answered in one call get the answer each gets
  alone, 3 of 4, none another row's, and per-row ``max_tokens`` that differ from each
  neighbour's are each respected); ``test_engine_refusal_fails_only_that_row`` (see
  :meth:`refused_row`, or declare :attr:`refuses_no_rows`); ``test_chat`` /
  ``test_completion`` / ``test_embedding`` (each task ``tasks_for`` serves works; one it does
  not serve is refused up front, naming it).
- :mod:`~relayllm.testing.kit.sampling`, one check per parameter every backend takes:
  ``test_max_tokens_honoured``, ``test_max_completion_tokens_honoured``,
  ``test_temperature_zero_is_deterministic``, ``test_temperature_one_varies_without_seed``
  (most rows get a new answer call to call: catches an adapter that always decodes greedily;
  an engine with one answer per prompt declares :attr:`greedy_only`),
  ``test_seed_makes_sampling_reproducible``, ``test_small_top_p_is_greedy``,
  ``test_stop_sequences_honoured`` / ``test_stop_string_honoured`` (a list, a plain string),
  ``test_presence_penalty_honoured`` / ``test_frequency_penalty_honoured`` (a penalty of 2
  changes a greedy answer that is the same across two calls into one that is the same
  across two calls: noise cannot pass it).
- :mod:`~relayllm.testing.kit.structured`: ``test_response_format_json_schema``,
  ``test_response_format_json_object`` (feature ``structured_outputs.json``),
  ``test_structured_output_choice``, ``test_structured_output_regex``,
  ``test_structured_output_grammar`` (features ``structured_outputs.<form>``).
- :mod:`~relayllm.testing.kit.features`: ``test_n_samples``,
  ``test_logprobs_and_top_logprobs``, ``test_prompt_logprobs``, ``test_tools_and_tool_choice``,
  ``test_chat_template_kwargs`` (declare :attr:`chat_template_kwargs_probe` or
  :attr:`chat_template_kwargs_untestable`), ``test_continue_final_message``.
- :mod:`~relayllm.testing.kit.reliability`: ``test_rows_of_one_call_run_concurrently``,
  ``test_retried_call_is_not_computed_twice``,
  ``test_two_sequential_processors_share_one_deployment``, ``test_health_reports_engine_down``
  (after :meth:`stop_engine`, or declare :attr:`engine_down_untestable`), ``test_undeploy``;
  these run last.

A check on an optional feature runs only when ``Backend.features_for(options)`` declares the
feature; otherwise the kit checks that a processor asking for it is refused before any row is
sent, and skips it, naming the feature. A sampling parameter the adapter refuses with the shared
policy's error (:func:`relayllm.adapters.check_sampling_support`) -- a penalty, or
``max_completion_tokens`` -- skips its check with that error. Declaring none of a required
pair (a refusal, an engine stop, a template probe) fails the check, saying what to add.

A standard test may be overridden only to mark it ``@pytest.mark.xfail(strict=True,
reason=...)``; the guard ``test_no_silent_overrides`` fails anything else, and a class-level
skip is an error at collection.
"""

from __future__ import annotations

from relayllm.testing.contract import HEAVY_MODULES, BackendContractTests, standard_tests
from relayllm.testing.kit.base import KitBase
from relayllm.testing.kit.features import FeatureChecks
from relayllm.testing.kit.reliability import ReliabilityChecks
from relayllm.testing.kit.sampling import SamplingChecks
from relayllm.testing.kit.structured import StructuredOutputChecks
from relayllm.testing.kit.tasks import TaskChecks


class BackendConformanceTests(
    ReliabilityChecks, FeatureChecks, StructuredOutputChecks, SamplingChecks, TaskChecks
):
    """Subclass, set :attr:`backend` (and :attr:`distribution`, :attr:`options`), say how the
    engine refuses a row (:attr:`context_length`, :meth:`refused_row` or
    :attr:`refuses_no_rows`) and how a test stops it (:meth:`stop_engine` or
    :attr:`engine_down_untestable`).

    pytest runs inherited tests base class first: tasks, sampling, structured outputs,
    features, then reliability, whose last two stop the engine and shut the deployment down."""


#: Every standard test a kit subclass inherits (the guard apart).
STANDARD_TESTS = tuple(standard_tests(BackendConformanceTests))
#: The standard tests that need a running engine (the rest are :class:`BackendContractTests`'):
#: what a suite that runs engines only on some machines selects there (a ``gpu`` marker).
ENGINE_CHECKS = tuple(t for t in STANDARD_TESTS if t not in standard_tests(BackendContractTests))

__all__ = [
    "ENGINE_CHECKS",
    "HEAVY_MODULES",
    "STANDARD_TESTS",
    "BackendConformanceTests",
    "KitBase",
]
