"""How a deployment with an HTTP front admits batch rows beside its interactive requests: the
targets and the limit's range, checked when the config is made (the controller that keeps
them: :mod:`relayllm.serving.admission`)."""

from __future__ import annotations

from pydantic import ConfigDict, Field, PositiveInt, model_validator

from relayllm.configbase import ConfigModel


class AdmissionConfig(ConfigModel):
    """The targets and limits of the admission controller (``DeploymentConfig.admission``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_ttft_s: float = Field(
        default=0.5, gt=0, description="Interactive time to first token to stay within."
    )
    target_tpot_s: float = Field(
        default=0.1,
        gt=0,
        description="Interactive time per output token (between streamed tokens) to stay "
        "within; the default is a reading pace of ten tokens a second.",
    )
    idle_s: float = Field(
        default=1.0,
        gt=0,
        description="Seconds with no interactive request in flight or begun after which the "
        "limit returns to max_batch_rows at once (batch work takes the idle engine).",
    )
    min_batch_rows: PositiveInt = Field(
        default=1, description="Batch rows always admitted: batch work never stops entirely."
    )
    max_batch_rows: PositiveInt = Field(
        default=256, description="Batch rows in the engine at most (and when nothing is slow)."
    )
    increase_rows: PositiveInt = Field(
        default=8,
        description="Rows added to the limit per interval with no slow request and a token "
        "in time while interactive traffic is present.",
    )
    decrease_factor: float = Field(
        default=0.5, gt=0, lt=1, description="The limit is multiplied by this on a slow request."
    )
    interval_s: float = Field(default=0.5, gt=0, description="How often the limit may move.")

    @model_validator(mode="after")
    def _ordered(self) -> AdmissionConfig:
        if self.min_batch_rows > self.max_batch_rows:
            raise ValueError("min_batch_rows must not exceed max_batch_rows")
        return self


__all__ = ["AdmissionConfig"]
