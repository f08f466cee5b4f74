import sys

from gpunode_exporter.cli import main

sys.exit(main())
