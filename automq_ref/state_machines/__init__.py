"""Pure state machines: ``step(state, event[, params]) -> Transition(state, effects)``.

Every machine returns the one shape of ``transition.py``: the next state and the effects, as
data, in the order the shell must execute them; a refused event is an effect (``Rejected``) or
the error of a response effect, never an exception. No asyncio, os, time or logging here
(tests/unit/test_state_machine_purity.py); the shell's driver (``automq_ref/io/driver.py``)
runs a step and executes its effects.
"""
