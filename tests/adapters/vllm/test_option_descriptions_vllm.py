"""Every option of the vllm backend is described where it is declared (the field list users
read comes from these descriptions)."""

from relayllm.configbase import undescribed_fields
from relayllm_vllm.options import VLLMOptions


def test_every_option_has_a_description():
    assert undescribed_fields(VLLMOptions) == []
