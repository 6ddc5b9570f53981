"""The kit's checks of structured outputs, one per form a backend declares: ``response_format``
(a JSON schema, or any JSON object: feature ``structured_outputs.json``) and
``structured_outputs`` ``choice``, ``regex`` and ``grammar``. Each answer the engine finishes
must have the form asked for; a form the backend does not declare is refused up front."""

from __future__ import annotations

import json
import re
from typing import Any

from relayllm.testing.kit.base import KitBase

#: Prompts a structured answer fits (checked against :data:`PLACE_SCHEMA`).
JSON_PROMPTS = (
    "In JSON: which city is the Eiffel Tower in, and in which year was it built?",
    "In JSON: which city is the Colosseum in, and in which year was it finished?",
    "In JSON: which city hosted the 2012 Olympic Games, and in which year?",
    "In JSON: which city is the Golden Gate Bridge in, and in which year did it open?",
)
PLACE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["city", "year"],
    "additionalProperties": False,
}
#: A regex every answer of the regex check must match whole (short: it always finishes).
PHONE_REGEX = r"[0-9]{3}-[0-9]{4}"
PHONE_PROMPTS = ("Make up a phone number.", "What is a phone number for a pizza place?")
#: A grammar (EBNF, the GBNF dialect) and the regex its sentences match.
PET_GRAMMAR = 'root ::= ("red" | "green" | "blue") " " ("cat" | "dog")'
PET_SENTENCE = r"(red|green|blue) (cat|dog)"
PET_PROMPTS = ("Name a color and a pet.", "Which pet do you like, and in which color?")


class StructuredOutputChecks(KitBase):
    """One check per structured-output form."""

    def test_response_format_json_schema(self, deployment):
        self._feature("structured_outputs.json")
        schema = {"type": "json_schema", "json_schema": {"name": "place", "schema": PLACE_SCHEMA}}
        for row in self._finished(JSON_PROMPTS, {"response_format": schema}, 64, "its JSON"):
            problem = _against_place_schema(row["generated_text"])
            assert problem is None, (
                f"row {row['id']} asked for a JSON schema and answered {row['generated_text']!r}: "
                f"{problem}"
            )

    def test_response_format_json_object(self, deployment):
        self._feature("structured_outputs.json")
        asked = {"response_format": {"type": "json_object"}}
        for row in self._finished(JSON_PROMPTS, asked, 64, "its JSON"):
            try:
                value = json.loads(row["generated_text"])
            except (TypeError, ValueError) as exc:
                value = exc
            assert isinstance(value, dict), (
                f"row {row['id']} asked for a JSON object (response_format json_object) and "
                f"answered {row['generated_text']!r}: not a JSON object"
            )

    def test_structured_output_choice(self, deployment):
        self._feature("structured_outputs.choice")
        task = self.text_task()
        choices = ["yes", "no"]
        params = {"structured_outputs": {"choice": choices}, "max_tokens": 8}
        texts = ["Is the sky blue? Answer yes or no.", "Is fire cold? Answer yes or no."]
        rows = [self.text_row(task, t, id=i) for i, t in enumerate(texts)]
        out = self.run(self.processor(task, sampling_params=params), rows)
        assert not self.errors(out), self.errors(out)
        answers = [r["generated_text"] for r in out]
        assert all((a or "").strip() in choices for a in answers), (
            f"choices {choices} asked, answers {answers}"
        )

    def test_structured_output_regex(self, deployment):
        self._feature("structured_outputs.regex")
        asked = {"structured_outputs": {"regex": PHONE_REGEX}}
        out = self._finished(PHONE_PROMPTS, asked, 24, "the regex's text", every=True)
        answers = [r["generated_text"] for r in out]
        assert all(re.fullmatch(PHONE_REGEX, a or "") for a in answers), (
            f"structured_outputs regex {PHONE_REGEX!r} asked, answers {answers}"
        )

    def test_structured_output_grammar(self, deployment):
        self._feature("structured_outputs.grammar")
        asked = {"structured_outputs": {"grammar": PET_GRAMMAR}}
        out = self._finished(PET_PROMPTS, asked, 24, "the grammar's sentence", every=True)
        answers = [r["generated_text"] for r in out]
        assert all(re.fullmatch(PET_SENTENCE, (a or "").strip()) for a in answers), (
            f"structured_outputs grammar {PET_GRAMMAR!r} asked, answers {answers}"
        )

    def _finished(
        self,
        texts: tuple[str, ...],
        params: dict[str, Any],
        budget: int,
        what: str,
        every: bool = False,
    ) -> list[dict[str, Any]]:
        """The rows (one per text) that finished for "stop" within ``budget`` tokens: at
        least one, or (``every``) all of them."""
        task = self.text_task()
        rows = [self.text_row(task, t, id=i) for i, t in enumerate(texts)]
        processor = self.processor(task, sampling_params={**params, "max_tokens": budget})
        out = self.run(processor, rows)
        assert not self.errors(out), self.errors(out)
        finished = [r for r in out if r["finish_reason"] == "stop"]
        assert finished and (not every or len(finished) == len(out)), (
            f"{len(finished)} of {len(out)} rows finished {what} within {budget} tokens: "
            f"{[(r['generated_text'], r['finish_reason']) for r in out]}"
        )
        return finished


def _against_place_schema(text: Any) -> str | None:
    """Why ``text`` is not a JSON instance of :data:`PLACE_SCHEMA`, or None."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        return f"not JSON ({exc})"
    if not isinstance(value, dict):
        return "not a JSON object"
    if set(value) != set(PLACE_SCHEMA["required"]):
        return f"keys {sorted(value)}, the schema has exactly {PLACE_SCHEMA['required']}"
    if not isinstance(value["city"], str):
        return "city is not a string"
    if not isinstance(value["year"], int) or isinstance(value["year"], bool):
        return "year is not an integer"
    return None


__all__ = [
    "JSON_PROMPTS",
    "PET_GRAMMAR",
    "PET_SENTENCE",
    "PHONE_REGEX",
    "PLACE_SCHEMA",
    "StructuredOutputChecks",
]
