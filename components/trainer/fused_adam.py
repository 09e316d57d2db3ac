"""`FusedAdam`: Keras's Adam whose per-variable update is one fused TensorFlow kernel.

Keras 3's Adam updates each variable with about ten element-wise ops (two
assign-adds, a square, a square root, a divide, ...), each a pass over the
variable's memory. TensorFlow's `ResourceApplyAdam` kernel does the same
update in one pass. The formula is Keras's own (Kingma & Ba 2015, with
Keras's placement of epsilon), so training follows the same trajectory up to
float rounding; at the TensorFlow tutorial's sizes (12.1 M parameters) the
update takes about 6 ms instead of 16-20 ms (`benchmarks/optimizer_update.py`,
docs/PERFORMANCE.md).
"""
from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="captioner")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` with TensorFlow's fused update kernel.

    Takes Adam's arguments and builds Adam's variables, so checkpoints and
    configs are interchangeable with `keras.optimizers.Adam`. The base class
    still applies gradient clipping, weight decay, EMA and loss scaling;
    only the per-variable update is fused. AMSGrad, non-TensorFlow backends
    and sparse gradients (`tf.IndexedSlices`, an embedding's) use Keras's
    update: Keras squares a sparse gradient's slices before summing repeated
    rows, which the fused kernel, given the summed gradient, cannot repeat.
    """

    def update_step(self, gradient, variable, learning_rate):
        """Adam's update of `variable` by `gradient`, in one kernel."""
        if (self.amsgrad or keras.backend.backend() != "tensorflow"
                or isinstance(gradient, tf.IndexedSlices)):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable), m=_handle(m), v=_handle(v),
            beta1_power=tf.pow(beta_1, step), beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype), beta1=beta_1, beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype), grad=tf.cast(gradient, dtype),
            use_locking=False)


def _handle(variable):
    """The resource handle of a Keras or TensorFlow variable (a distributed
    variable gives the handle of the component being updated)."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle
