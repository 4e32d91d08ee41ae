"""Tests of the benchmark scripts and their helpers. Not under tests/unit: the mutation run
(tests/mutation) copies src and tests only, and these import benchmarks/."""
