"""Storage: block devices, the WAL, object stores, S3Storage (streams over WAL and objects)."""
