"""ps's ``horovod`` package (not Horovod's): ``import horovod.torch as hvd`` gives ``ps.torch``,
``import horovod.mxnet as hvd`` ps.mxnet's Horovod API, so a Horovod script runs on ps's
parameter servers with no line changed. ``python -m ps.launch`` puts it on the path
(``PS_HOROVOD``); by hand, ``PYTHONPATH=$(python -m ps.horovod --path)``. docs/torch.md.
"""


def run(*args, **kwargs):
    """Horovod's ``horovod.run`` starts the job from inside Python (horovodrun's API); ps
    starts jobs from outside: say how."""
    raise NotImplementedError("horovod.run is Horovod's launcher, which ps does not have: start the script with "
                              "`python -m ps.launch -n N -s S python script.py` or `mpirun -np N python script.py`")
