"""Training-step workloads of whole models: ResNet-50, BERT-base and ViT-B/16.

Each module exports ``SPEC`` (a :class:`~kernels.spec.KernelSpec`), ``TOLERANCE`` (relative
norm-wise error allowed per dtype/precision) and ``footprint(size, itemsize)``. Importing this
package imports neither JAX, Flax, TensorFlow nor Keras.
"""
