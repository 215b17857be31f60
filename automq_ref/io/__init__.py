"""The async I/O shell: object stores, WALs, metadata logs, RPC. It executes the machines' effects."""
