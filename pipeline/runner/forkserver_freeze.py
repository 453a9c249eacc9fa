"""Imported last by the worker processes' forkserver (``runner.start_method: forkserver``): freezes the objects
of the modules preloaded before it (``gc.freeze``), as the ``gc`` documentation advises before forking.

The workers are forked from that process. Frozen, the inherited objects are skipped by every garbage
collection: a worker's collections neither walk them nor write to them (which would copy their memory pages into
each worker), and the forkserver's exit does not walk torch's and MONAI's objects once more (about a second
of CPU).
"""

import gc

gc.freeze()
