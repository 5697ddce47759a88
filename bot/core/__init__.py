"""Pure parts: the plan, the flows, policy, parsers, redaction, events. No I/O."""
