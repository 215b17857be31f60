"""Metadata: the metadata log and the controller shell that applies StreamMetadata over it."""
