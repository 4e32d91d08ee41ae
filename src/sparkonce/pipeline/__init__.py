"""Orchestration: a Pipeline ties a source, a transform and a sink to Spark."""

from sparkonce.observe.report import BatchReport, RunReport
from sparkonce.pipeline.pipeline import Pipeline
from sparkonce.spark.session import build_session

__all__ = ["BatchReport", "Pipeline", "RunReport", "build_session"]
