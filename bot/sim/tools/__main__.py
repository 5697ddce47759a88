import sys

from bot.sim.tools import main

raise SystemExit(main(sys.argv[1:]))
