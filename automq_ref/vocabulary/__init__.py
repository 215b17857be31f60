"""Shared vocabulary, the bottom layer: the types and names that formats, machines and the shell
all speak (metadata record types, naming rules for object keys, KV keys and the internal
namespace). Pure: imports nothing from the rest of automq_ref but ``errors``."""
