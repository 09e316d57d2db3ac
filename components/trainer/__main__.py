"""`python -m components.trainer` (see components/trainer/stage.py)."""
import sys

from components.contract import quiet

quiet.install_if_asked()  # before anything imports TensorFlow

from components.trainer.stage import main  # noqa: E402

sys.exit(main())
