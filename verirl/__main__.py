"""``python -m verirl`` runs the command line."""

import sys

from verirl.cli import main

sys.exit(main())
