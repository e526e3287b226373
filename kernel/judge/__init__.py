"""The `judge` decision's providers: the HTTP call to a model that answers probabilities."""

from kernel.judge.http_judge import HttpJudge, JudgeLimits
from kernel.judge.provider import JudgeProvider, load_provider, parse_provider, typesafe_provider

__all__ = ["HttpJudge", "JudgeLimits", "JudgeProvider", "load_provider", "parse_provider", "typesafe_provider"]
