"""automq-ref: a formally specified reference implementation of AutoMQ."""

__version__ = "0.1.0"
