import sys

from ddtree_runtime.labserver.server import main

sys.exit(main())
