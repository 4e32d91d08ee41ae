"""Orchestration: a Pipeline ties a source, a transform and a sink to Spark."""

from sparkonce.pipeline.pipeline import Pipeline
from sparkonce.pipeline.runner import BatchReport, RunReport
from sparkonce.spark.session import build_session

__all__ = ["BatchReport", "Pipeline", "RunReport", "build_session"]
