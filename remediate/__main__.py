import sys

from gpunode_remediate.cli import main

sys.exit(main())
