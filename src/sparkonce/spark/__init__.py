"""Spark's plumbing, below the sources and sinks: building a session and the settings it needs
(:mod:`.session`), the connector jars (:mod:`.jars`), the driver JVM's class-data archive
(:mod:`.classdata`), reading a query's checkpoint (:mod:`.checkpoint`), and the py4j adapter
for Delta Lake's internals (:mod:`.delta`).

Nothing here imports a source, a sink, a ledger store or the pipeline: those import this.
"""
