"""The phases of the maintenance flows (``bot.core.flows`` composes them): pure generators
that yield actions and consume replies (``bot.core.phases.actions``)."""
