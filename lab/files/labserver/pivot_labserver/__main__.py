import sys

from pivot_labserver.server import main

sys.exit(main())
