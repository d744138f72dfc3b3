import sys

from tests.mutation.runner import main

sys.exit(main(sys.argv[1:]))
