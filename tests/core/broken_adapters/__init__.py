"""Deliberately broken adapters, one defect each, for the conformance kit's own test
(``tests/core/test_kit_catches_broken_adapters.py``). Echo-style: no model."""
