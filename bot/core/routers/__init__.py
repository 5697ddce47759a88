"""Routers in front of a service's replicas (issue 19): what the bot reads from them and
the commands that take a replica out of rotation and put it back. Pure: argv builders and
parsers; the phases in ``bot.core.phases.rotation`` yield them as actions."""
