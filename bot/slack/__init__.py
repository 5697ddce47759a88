"""The Slack front end: app, front end, cards, poster and reporter, grammar and listeners."""
