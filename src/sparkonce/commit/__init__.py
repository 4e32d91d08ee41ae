"""The committer: the commit protocol (``docs/concepts/protocol.md``), once for every sink."""

from sparkonce.commit.base import Staged, Stager
from sparkonce.commit.committer import COMMIT_ATTEMPTS, Committer
from sparkonce.commit.steps import CORRECT_STEPS, CommitSteps, CorrectSteps

__all__ = [
    "COMMIT_ATTEMPTS",
    "CORRECT_STEPS",
    "CommitSteps",
    "Committer",
    "CorrectSteps",
    "Staged",
    "Stager",
]
