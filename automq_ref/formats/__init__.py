"""Byte layouts, pure: no I/O, no clock. Every parser raises a FormatError subclass on bad bytes."""
