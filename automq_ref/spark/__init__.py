"""Spark sources over the broker (`automq`) and over its objects (`automq-objects`)."""
