"""Naming the cause of a failed query in one line (sparkonce.pipeline.failure)."""

from __future__ import annotations

from sparkonce.errors import FencedError, OffsetOutOfRangeError, SinkUnavailableError
from sparkonce.pipeline.failure import find_cause, rebuild, where_suffix

# The shapes seen from PySpark 4.2: a StreamingQueryException whose first line names only
# the wrappers, a Python traceback inside, and the real cause deep in the text.
_WRAPPED = """[STREAM_FAILED] Query [id = 83ca, runId = 515e] terminated with exception: \
[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in \
foreach batch sink. Reason: An exception was raised by the Python Proxy. Return Message: \
Traceback (most recent call last):
  File "/x/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
{inner}
	at org.apache.spark.sql.execution.streaming.sources.ForeachBatchSink.callBatchWriter(X.scala:56)
"""


def test_spark_error_class_is_found_behind_the_wrappers() -> None:
    inner = (
        "pyspark.errors.exceptions.captured.NumberFormatException: [CAST_INVALID_INPUT] The "
        'value \'abc\' of the type "STRING" cannot be cast to "BIGINT" because it is '
        "malformed. SQLSTATE: 22018"
    )
    cause = find_cause(_WRAPPED.format(inner=inner))
    assert cause.spark_class == "CAST_INVALID_INPUT"
    assert cause.message.startswith("[CAST_INVALID_INPUT] The value 'abc'")
    assert cause.error is None


def test_a_sparkonce_error_raised_in_a_task_keeps_its_class() -> None:
    inner = (
        "pyspark.errors.exceptions.captured.PythonException: \n"
        "  An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n"
        '  File "/x/sparkonce/sinks/twophase.py", line 500, in _precommit_task\n'
        "sparkonce.errors.SinkUnavailableError: cannot connect to PostgreSQL at "
        "127.0.0.1:5 after 4 attempt(s)"
    )
    cause = find_cause(_WRAPPED.format(inner=inner))
    assert cause.error is SinkUnavailableError
    err = rebuild(cause, "(pipeline 'p', batch 3 [t[0]:0..5])")
    assert isinstance(err, SinkUnavailableError)
    assert str(err) == (
        "cannot connect to PostgreSQL at 127.0.0.1:5 after 4 attempt(s) "
        "(pipeline 'p', batch 3 [t[0]:0..5])"
    )


def test_an_error_class_with_a_custom_init_is_rebuilt_without_calling_it() -> None:
    cause = find_cause("sparkonce.errors.FencedError: pipeline 'p': this run holds epoch 1")
    err = rebuild(cause, "")
    assert isinstance(err, FencedError) and str(err).startswith("pipeline 'p'")


def test_plain_python_error_and_fallbacks() -> None:
    inner = 'ZeroDivisionError: division by zero\n  File "x.py", line 1'
    assert find_cause(_WRAPPED.format(inner=inner)).message == "ZeroDivisionError: division by zero"
    assert find_cause("something broke\nmore").message == "something broke"
    assert find_cause("").message == "unknown error"
    # A name that looks like a sparkonce error but is not one is not rebuilt.
    cause = find_cause("sparkonce.errors.NoSuchError: x\nValueError: y")
    assert cause.error is None and cause.message == "ValueError: y"


def test_long_messages_are_clipped() -> None:
    cause = find_cause("[SOME_ERROR] " + "x" * 5000)
    assert len(cause.message) <= 600 and cause.message.endswith("...")


def test_kafka_connector_data_loss_is_an_offset_out_of_range_error() -> None:
    text = (
        "[STREAM_FAILED] Query terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] "
        "An error occurred\n"
        "Caused by: org.apache.spark.sql.kafka010.KafkaIllegalStateException: Some data may have "
        "been lost because they are not available in Kafka any more;\n"
        "Caused by: org.apache.kafka.clients.consumer.OffsetOutOfRangeException: Fetch position "
        "FetchPosition{offset=20, offsetEpoch=Optional.empty} is out of range for partition ev-0\n"
    )
    cause = find_cause(text)
    assert cause.error is OffsetOutOfRangeError
    assert cause.message.startswith(
        "Some data may have been lost because they are not available in Kafka any more "
        "(offset 20 of ev-0 is gone). Records this run still needed were deleted from Kafka"
    ), cause.message
    assert "Nothing was skipped" in cause.message


def test_a_store_connection_lost_in_a_task_is_sink_unavailable() -> None:
    """PostgreSQL killed while a two-phase task held its pre-commit (the text PySpark 4.2
    gives), and a Kafka client's transport error: exit 4, as on the driver."""
    inner = (
        "pyspark.errors.exceptions.captured.PythonException: An exception was thrown from "
        "the Python worker:\nTraceback (most recent call last):\n"
        '  File "/x/sparkonce/sinks/twophase.py", line 649, in _copy_batch\n'
        "psycopg.OperationalError: consuming input failed: server closed the connection "
        "unexpectedly\n\tThis probably means the server terminated abnormally\n"
    )
    cause = find_cause(_WRAPPED.format(inner=inner))
    assert cause.error is SinkUnavailableError
    assert cause.message.startswith(
        "psycopg OperationalError: consuming input failed: server closed the connection "
        "unexpectedly. A Spark task lost its connection to the store."
    ), cause.message
    kafka = find_cause(
        _WRAPPED.format(
            inner='cimpl.KafkaException: KafkaError{code=_TRANSPORT,val=-195,str="Connection '
            'refused"}'
        )
    )
    assert kafka.error is SinkUnavailableError
    # A SQL error of the store's is not an outage, nor is a Kafka error that is not transport.
    for inner in (
        'psycopg.errors.UniqueViolation: duplicate key value violates unique constraint "k"',
        'cimpl.KafkaException: KafkaError{code=TOPIC_AUTHORIZATION_FAILED,val=29,str="x"}',
    ):
        assert find_cause(_WRAPPED.format(inner=inner)).error is None


def test_an_error_that_names_its_batch_gets_no_second_context() -> None:
    """On Spark Connect the batch function names the pipeline and batch where it runs; the
    user's process, rebuilding the error, adds nothing then (it used to add its own guess,
    "(pipeline 'p', the query, before its next batch was planned,)", after it)."""
    worker = "fenced: pipeline 'p': this run holds epoch 1 (pipeline 'p', batch 1 [t[0]:0..5])"
    assert where_suffix(worker, "p", "batch 2 [t[0]:5..9]") == ""
    assert where_suffix("fenced: epoch 1", "p", "batch 2 [x]") == "(pipeline 'p', batch 2 [x])"
    # Another pipeline's name in the message is no context of this one.
    assert where_suffix(worker, "q", "batch 2 [x]") == "(pipeline 'q', batch 2 [x])"
