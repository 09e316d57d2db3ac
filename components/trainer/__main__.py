"""`python -m components.trainer` (see components/trainer/worker.py)."""
import sys

from components.trainer.worker import main

sys.exit(main())
