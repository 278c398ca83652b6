import sys

from benchmarks.anchors.run import main

sys.exit(main())
