"""The terminal front end: the command line, the terminal sink and the demo."""
