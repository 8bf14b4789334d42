"""All service, worker and stack settings: one pydantic-settings class, env prefix FUSEWIRE_.

    FUSEWIRE_REDIS_URL=redis://host:6379/0   (plain REDIS_URL is read too)
    FUSEWIRE_KEY_PREFIX=fw:
    FUSEWIRE_TOKENS="tok-abc=vision,tok-def=speech"   or   FUSEWIRE_TOKENS_FILE=/etc/fusewire/tokens
    FUSEWIRE_RATE_LIMIT_PER_MINUTE=600
    FUSEWIRE_SIGNING_KEY_FILE=/etc/fusewire/signing.pem   (workers: the key artifacts are signed with)

The API, the Celery worker and `fusewire up` all build their configuration from this
class, so a setting means the same thing in every process.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger("fusewire.settings")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FUSEWIRE_", extra="ignore", frozen=True)

    # Redis: the one store and the Celery broker.
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("FUSEWIRE_REDIS_URL", "REDIS_URL", "redis_url"),
        description="Redis for artifacts, jobs, graphs, counters and the Celery broker",
    )
    key_prefix: str = Field("fw:", description="prefix of every Redis key fusewire writes, Celery's included")

    # Auth. No tokens configured at all = open mode (see docs/SERVICE.md).
    tokens: str = Field("", description="'token=team,token=team' pairs")
    tokens_file: Path | None = Field(None, description="file of 'token=team' lines ('#' comments)")

    # Limits.
    rate_limit_per_minute: int = Field(600, ge=0, description="POST /compile per team per minute; 0 = no limit")
    team_rate_limits: dict[str, int] = Field(default_factory=dict, description='per-team overrides, JSON: {"vision": 60}')
    max_request_bytes: int = Field(16 * 1024 * 1024 + 64 * 1024, ge=1024, description="largest request body (413 above)")
    targets: list[str] | None = Field(None, description="targets accepted by POST /compile; None = any valid target")
    compile_seconds_per_hour: float = Field(7200.0, ge=0, description="compile seconds a team's jobs may take per "
                                            "hour before its new submissions get 429; 0 = no budget")
    team_compile_budgets: dict[str, float] = Field(default_factory=dict, description='per-team overrides, JSON: {"vision": 600}')
    max_tensor_elements: int = Field(2**34, ge=1, description="elements of any tensor of a graph (inputs, intermediates, outputs)")
    max_planned_bytes: int = Field(192 * 2**30, ge=1, description="bytes a graph's launch plan may hold at once")

    # Trust: workers sign every artifact with this Ed25519 key; clients verify (docs/TRUST.md).
    signing_key_file: Path | None = Field(None, description="worker's Ed25519 private key (PEM, `fusewire keygen`)")

    # Artifact serving.
    artifact_cache_bytes: int = Field(256 * 1024 * 1024, ge=0, description="per-process memory cache of verified artifacts")

    # Jobs and the worker.
    soft_time_limit_s: float = Field(900.0, gt=0, description="a compile past this is stopped and recorded failed")
    hard_time_limit_s: float = Field(960.0, gt=0, description="the worker process running a compile past this is killed")
    visibility_timeout_s: float = Field(1800.0, gt=0, description="an unacknowledged task is redelivered after this")
    unacked_restore_interval_s: float = Field(10.0, gt=0, description="how often workers sweep for unacknowledged tasks")
    max_deliveries: int = Field(3, ge=1, description="a job whose worker died this often is recorded failed")
    infra_retries: int = Field(3, ge=0, description="retries of a task that hit a Redis connection error")
    job_ttl_s: int = Field(7 * 24 * 3600, ge=60, description="how long job records and unfinished graphs are kept")
    heartbeat_interval_s: float = Field(5.0, gt=0, description="how often a worker refreshes its heartbeat")
    heartbeat_ttl_s: float = Field(20.0, gt=0, description="a worker unseen this long is counted dead by /readyz")

    @model_validator(mode="after")
    def _consistent(self) -> "Settings":
        if self.hard_time_limit_s < self.soft_time_limit_s:
            raise ValueError("hard_time_limit_s must be >= soft_time_limit_s")
        return self

    @property
    def job_stale_s(self) -> float:
        """A queued/running job not updated for this long is taken as lost: a new submission re-enqueues it."""
        return self.hard_time_limit_s + self.visibility_timeout_s + 60

    def token_table(self) -> dict[str, str]:
        """token -> team, from FUSEWIRE_TOKENS and FUSEWIRE_TOKENS_FILE together."""
        table = dict(_pairs(self.tokens.replace(",", "\n"), "FUSEWIRE_TOKENS"))
        if self.tokens_file is not None:
            table.update(_pairs(self.tokens_file.read_text(), str(self.tokens_file)))
        return table

    def rate_limit_for(self, team: str) -> int:
        return self.team_rate_limits.get(team, self.rate_limit_per_minute)

    def compile_budget_for(self, team: str) -> float:
        return self.team_compile_budgets.get(team, self.compile_seconds_per_hour)

    def work_limits(self):
        """compiler.bounds.WorkLimits from these settings (imported here: the API needs no torch for it)."""
        from compiler.bounds import WorkLimits

        return WorkLimits(max_tensor_elements=self.max_tensor_elements, max_planned_bytes=self.max_planned_bytes)


def _pairs(text: str, source: str) -> list[tuple[str, str]]:
    pairs = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        token, sep, team = (part.strip() for part in line.partition("="))
        if not sep or not token or not team:
            raise ValueError(f"{source} line {number}: expected 'token=team'")
        pairs.append((token, team))
    return pairs


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings()
