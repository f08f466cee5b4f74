import sys

from remediate.cli import main

sys.exit(main())
