"""Entry file for ``spark-submit spark_jobs/main.py --input ... --workdir ...``.

spark-submit runs this file as a script, so the repository root is put on the path first (the
package may not be installed on a cluster's driver).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_jobs.cli import main

if __name__ == "__main__":
    sys.exit(main())
