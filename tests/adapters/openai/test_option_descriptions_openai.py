"""Every option of the openai backend is described where it is declared (the field list users
read comes from these descriptions)."""

from relayllm.configbase import undescribed_fields
from relayllm_openai.options import OpenAIOptions


def test_every_option_has_a_description():
    assert undescribed_fields(OpenAIOptions) == []
