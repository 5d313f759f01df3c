"""``horovod.runner``: only what Horovod's test helpers import (ps's launcher is ``python -m ps.launch``)."""
