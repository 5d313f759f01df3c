"""``horovod.torch.elastic.sampler``, where Horovod defines ``ElasticSampler``."""
from ps.torch.elastic import ElasticSampler  # noqa: F401
