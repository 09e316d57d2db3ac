"""`python -m serving.server`: the same as `captioner serve`."""
import sys

from serving.server.model_server import main

sys.exit(main())
