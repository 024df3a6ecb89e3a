"""`python -m deviceplugin`: the `deviceplugin` command."""

import sys

from deviceplugin.cli import main

sys.exit(main())
