"""Simulator settings: cluster, serving physics, SLO and run parameters, overridable from YAML.

Defaults live here and only here; `docs/simulator.md` gives the source or the reasoning
behind each serving number.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autoscaler import strict_yaml
from autoscaler.core.policy import MAX_LEAD_TIME_S
from autoscaler.sim.errors import ConfigError
from autoscaler.validation_errors import describe_validation_error, refuse_yes_or_no

# Every step is a row of each time series and one pass of the loop, so a run's memory and
# time grow with duration / step: 1ms over an hour ran for minutes, 1ns asked for TiBs.
# A tenth of a second is far finer than anything the simulator models (a 15 s control loop
# by default, minutes to start a gang).
MIN_STEP_S = 0.1


class _Settings(BaseModel):
    # `.inf` in the YAML reached `round()` and scipy as tracebacks: every number is finite
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # no setting here is a yes/no (`gpus_per_node: yes` was blamed on gpus_per_pod)
    _no_yes_or_no = field_validator("*", mode="before")(refuse_yes_or_no)


class ClusterSettings(_Settings):
    gpus_per_node: int = Field(default=8, gt=0, description="GPUs on one node")
    gpus_per_pod: int = Field(default=8, gt=0, description="GPUs one gang member pod requests")
    pods_per_gang: int = Field(default=2, gt=0, description="pods in one gang (leader + workers)")
    max_nodes: int | None = Field(default=None, gt=0, description="cap on nodes; None = unlimited")
    node_provisioning_s: float = Field(default=300.0, ge=0, description="new node to schedulable")
    gang_startup_s: float = Field(
        default=180.0, ge=0, description="all pods placed to serving (weights load, NCCL ring)"
    )
    node_idle_timeout_s: float = Field(
        default=600.0, ge=0, description="an empty node is removed after this long (CA default 10m)"
    )

    @model_validator(mode="after")
    def _pod_fits_node(self) -> ClusterSettings:
        if self.gpus_per_pod > self.gpus_per_node:
            raise ValueError("gpus_per_pod must not exceed gpus_per_node")
        return self

    @property
    def pods_per_node(self) -> int:
        return self.gpus_per_node // self.gpus_per_pod

    @property
    def gpus_per_gang(self) -> int:
        return self.gpus_per_pod * self.pods_per_gang


class ServingSettings(_Settings):
    """Per-gang serving capacity (a gang's figures are per-pod figures times pods_per_gang)."""

    prefill_tokens_per_s_per_pod: float = Field(
        default=20_000.0,
        gt=0,
        description="prompt tokens/s one 8-GPU pod prefills, 70B-class model",
    )
    decode_tokens_per_s_per_pod: float = Field(
        default=12_000.0, gt=0, description="generated tokens/s of one 8-GPU pod at full batch"
    )
    max_sequences_per_pod: int = Field(
        default=256, gt=0, description="concurrent decode sequences per pod (vLLM max_num_seqs)"
    )
    kv_cache_tokens_per_pod: float = Field(
        default=1_270_000.0,
        gt=0,
        description="prompt and generated tokens whose KV cache one 8-GPU pod holds, 70B-class "
        "model (vllm:kv_cache_usage_perc is the share of it in use)",
    )
    prefill_batch_tokens: int = Field(
        default=8192,
        gt=0,
        description="prompt tokens one prefill engine schedules per iteration (vLLM "
        "max_num_batched_tokens): the prompts whose KV blocks are allocated while they run",
    )
    unified_decode_interference: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="share of a unified gang's prefill capacity lost when its decode batch "
        "is full (decode steps and prefill chunks share each iteration)",
    )

    def prefill_tokens_per_s(self, pods_per_gang: int) -> float:
        return self.prefill_tokens_per_s_per_pod * pods_per_gang

    def decode_tokens_per_s(self, pods_per_gang: int) -> float:
        return self.decode_tokens_per_s_per_pod * pods_per_gang

    def kv_cache_tokens(self, pods_per_gang: int) -> float:
        return self.kv_cache_tokens_per_pod * pods_per_gang

    def max_sequences(self, pods_per_gang: int) -> int:
        return self.max_sequences_per_pod * pods_per_gang


class GangPolicySettings(_Settings):
    """Annotation values the simulator puts on the simulated LWS objects for `gang`.

    Keys are the DESIGN section 5 annotation names without the prefix; values are strings,
    exactly as an operator would write them.
    """

    prefill: dict[str, str] = Field(default_factory=dict)
    decode: dict[str, str] = Field(default_factory=dict)
    unified: dict[str, str] = Field(default_factory=dict)

    @field_validator("prefill", "decode", "unified", mode="before")
    @classmethod
    def _quoted(cls, value: Any) -> Any:
        # Kubernetes refuses an unquoted `min-buffer: 1` on an LWS; so does this file, saying
        # how to write it rather than pydantic's "Input should be a valid string"
        if isinstance(value, Mapping):
            unquoted = [
                f'{key}: "{str(given).lower() if isinstance(given, bool) else given}"'
                for key, given in value.items()
                if isinstance(given, bool | int | float)
            ]
            if unquoted:
                raise ValueError(
                    "annotation values are strings, as on the LWS; quote them: "
                    + ", ".join(unquoted)
                )
        return value

    # capacity-per-replica defaults to these shares of a gang's measured capacity; None
    # leaves the annotation unset, so the component learns its capacity as the service does
    # when an operator has not measured one.
    # The headroom for bursts is the forecast floor's burst factor, read from the traffic
    # (core/burst.py); these leave a tenth of a gang beyond it.
    prefill_target_utilization: float | None = Field(
        default=0.9,
        gt=0,
        le=1,
        description="capacity-per-replica of prefill gangs as a share of what one serves "
        "saturated; null: unset, learned",
    )
    unified_target_utilization: float | None = Field(
        default=0.8,
        gt=0,
        le=1,
        description="capacity-per-replica of unified gangs as a share of what one serves "
        "saturated: its decode batch takes prefill capacity as it fills, so a burst of "
        "prompts costs a unified gang more than its share of a saturated minute; null: unset, "
        "learned",
    )
    decode_target_utilization: float | None = Field(
        default=0.9,
        gt=0,
        le=1,
        description="capacity-per-replica of decode gangs as a share of what one serves "
        "saturated; null: unset, learned",
    )
    forecast_refit_s: float = Field(default=3600.0, gt=0, description="forecaster refit cadence")
    forecast_refit_long_s: float = Field(
        default=6 * 3600.0,
        gt=0,
        description="refit cadence on traces longer than a day (a daily-cycle model fitted on "
        "up to 14 days changes little in an hour, and each fit costs about a second)",
    )
    forecast_history_s: float = Field(
        default=14 * 86_400.0, gt=0, description="demand history the forecaster is fitted on"
    )
    forecast_resolution_s: float = Field(
        default=60.0, gt=0, description="forecast grid for traces up to a day (300 s beyond)"
    )


class SimSettings(_Settings):
    step_s: float = Field(default=5.0, description=f"simulation step, at least {MIN_STEP_S:g} s")
    tick_s: float = Field(default=15.0, gt=0, description="control loop period")
    slo_ttft_s: float = Field(default=2.0, gt=0, description="time-to-first-token objective")
    seed: int = Field(default=0, ge=0, description="seed of arrivals sampled from rate series")
    mode: str = Field(default="pd", pattern="^(pd|unified)$")
    demand_window_s: float = Field(
        default=60.0, gt=0, description="rate() window of demand signals"
    )
    target_peak_gangs: int = Field(
        default=8,
        gt=0,
        description="auto --scale sizes a trace so its busiest minute needs this many",
    )
    max_gangs_factor: float = Field(
        default=2.0,
        ge=1,
        description="max-replicas of gang and reactive, times the static (peak) gangs",
    )
    node_quota_factor: float | None = Field(
        default=1.5,
        ge=1,
        description="when cluster.max_nodes is unset, cap nodes at this times what static "
        "needs (a cluster quota); None = unlimited",
    )
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    gang: GangPolicySettings = Field(default_factory=GangPolicySettings)

    @field_validator("step_s")
    @classmethod
    def _step_long_enough(cls, value: float) -> float:
        if not value >= MIN_STEP_S:  # also NaN
            raise ValueError(
                f"{value:g} s is shorter than {MIN_STEP_S:g} s, the shortest step the "
                "simulator takes (a run's memory and time grow with the number of steps)"
            )
        return value

    @model_validator(mode="after")
    def _tick_is_whole_steps(self) -> SimSettings:
        ratio = self.tick_s / self.step_s
        if abs(ratio - round(ratio)) > 1e-9 or ratio < 1:
            raise ValueError(
                f"tick_s ({self.tick_s:g} s) must be a whole multiple of step_s ({self.step_s:g} s)"
            )
        return self

    @model_validator(mode="after")
    def _lead_time_at_most_a_day(self) -> SimSettings:
        # `gang`'s lead-time annotation is this sum, and the policy takes at most 24h; said
        # here it names the settings, not an annotation nobody wrote (1e9 s also ran for
        # minutes in the oracle's look-ahead before failing)
        lead_s = self.cluster.node_provisioning_s + self.cluster.gang_startup_s + self.tick_s
        if lead_s > MAX_LEAD_TIME_S:
            raise ValueError(
                f"cluster.node_provisioning_s + cluster.gang_startup_s + tick_s ({lead_s:g} s) "
                "is the lead time of a new gang, at most 24h"
            )
        return self


def load_settings(
    path: Path | None = None, *, flags: Mapping[str, str] | None = None, **overrides: Any
) -> SimSettings:
    """Defaults, then the YAML file (nested like SimSettings), then explicit overrides.

    `flags` names the command-line flag each override came from (`step_s` -> `--step`), so
    a problem with it names the flag.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = strict_yaml.load(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise ConfigError(
                f"{path}: cannot read simulator configuration: {err.strerror or err}"
            ) from err
        except UnicodeDecodeError as err:
            raise ConfigError(f"{path}: cannot read simulator configuration: {err}") from err
        except yaml.YAMLError as err:
            why = " ".join(str(err).split())
            raise ConfigError(f"{path}: simulator configuration is not valid YAML: {why}") from err
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
        data.update(loaded or {})
    given = {k: v for k, v in overrides.items() if v is not None}
    data.update(given)
    try:
        return SimSettings.model_validate(data)
    except ValidationError as err:
        where = f"{path}: " if path else ""
        names = {k: v for k, v in (flags or {}).items() if k in given}
        raise ConfigError(
            f"{where}invalid simulator configuration:\n"
            + describe_validation_error(err, names=names)
        ) from err
