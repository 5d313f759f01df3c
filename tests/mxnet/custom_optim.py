"""An optimizer ps has no numpy version of: exercises the opt-in pickled path."""
import mxnet as mx


@mx.optimizer.register
class HalfSGD(mx.optimizer.Optimizer):
    """Plain SGD at half the learning rate."""

    def create_state(self, index, weight):
        return None

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr = self._get_lr(index)
        weight[:] -= 0.5 * lr * grad * self.rescale_grad
