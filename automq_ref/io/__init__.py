"""The async I/O shell: object stores, WALs, metadata logs, RPC; it executes effects."""
