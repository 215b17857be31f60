"""Pure state machines: (state, event) -> (state, effects). No asyncio, os, time, random or logging."""
