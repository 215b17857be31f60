"""Pure state machines: (state, event) -> (state, effects); no asyncio, os, time or logging."""
