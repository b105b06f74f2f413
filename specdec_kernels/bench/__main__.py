import sys

from specdec_kernels.bench.cli import main

sys.exit(main())
