"""Every option of the sglang backend is described where it is declared (the field list users
read comes from these descriptions)."""

from relayllm.configbase import undescribed_fields
from relayllm_sglang.options import SGLangOptions


def test_every_option_has_a_description():
    assert undescribed_fields(SGLangOptions) == []
