"""The nightly reconciliation as a Spark application: `spark-submit reconcile/main.py [options]`.

The job is `kdiv.reconcile.job`, installed with the kdiv package; this script only starts it, so
spark-submit's habit of putting the script's folder first on sys.path shadows nothing.
`kdiv reconcile` submits the same entry with working defaults (kdiv.reconcile.submit).
"""

import sys

from kdiv.reconcile.job import main_guarded

if __name__ == "__main__":
    sys.exit(main_guarded())
