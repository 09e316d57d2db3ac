"""`python -m components.trainer` (see components/trainer/worker.py)."""
import sys

from components.contract import quiet

quiet.install_if_asked()  # before anything imports TensorFlow

from components.trainer.worker import main  # noqa: E402

sys.exit(main())
