"""``python -m spark_jobs``."""

import sys

from spark_jobs.cli import main

sys.exit(main())
