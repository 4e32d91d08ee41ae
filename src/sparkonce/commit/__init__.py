"""The committer: the commit protocol (``docs/concepts/protocol.md``), once for every sink."""

from sparkonce.commit.base import Staged, Stager
from sparkonce.commit.committer import COMMIT_ATTEMPTS, Committer
from sparkonce.commit.steps import CORRECT_STEPS, CommitSteps, Committing, CorrectSteps
from sparkonce.commit.tasks import CORRECT_TASK_STEPS, CorrectTaskSteps, Task, TaskResult, TaskSteps

__all__ = [
    "COMMIT_ATTEMPTS",
    "CORRECT_STEPS",
    "CORRECT_TASK_STEPS",
    "CommitSteps",
    "Committer",
    "Committing",
    "CorrectSteps",
    "CorrectTaskSteps",
    "Staged",
    "Stager",
    "Task",
    "TaskResult",
    "TaskSteps",
]
