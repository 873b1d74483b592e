"""Training-step workloads of whole models: ResNet-50, BERT-base and ViT-B/16.

Each module (:mod:`~kernels.models.resnet50_train`, :mod:`~kernels.models.bert_train`,
:mod:`~kernels.models.vit_train`) exports ``SPEC`` (a :class:`~kernels.spec.KernelSpec` in the
mould of :mod:`kernels.mlp_train`), ``TOLERANCE`` and ``footprint(size, itemsize)``; what they
share (parameters, the step in each framework, the float64 reference, counting) is in
:mod:`kernels.models.common` and :mod:`kernels.models.transformer`. Importing this package
imports neither JAX, Flax, TensorFlow, Keras nor PyTorch. float32 only (see bert_train for why).

Tolerances (relative norm-wise error of ``[loss, new parameters]`` against the float64 reference,
as in :mod:`kernels.checks`). The output is the updated parameters, so its error is essentially
their float32 rounding (2**-24 = 6e-8 of each, 3e-8 norm-wise); the gradients' own error only
enters through the update, which is 0.2-0.9 % of the parameters' norm. Measured on this CPU
(jaxlib 0.10.2, TF 2.21, Keras 3.15), JAX / TF graph / TF+XLA:

============== ============================== ========== ======= ==============================
workload       measured fp32 (tiny; cpu)      fp32 tol   tf32    doubled learning rate gives
============== ============================== ========== ======= ==============================
resnet50_train 3.2e-8 (3.6e-8 seed 1); 2.8e-8  1e-6       3e-4    6.3e-3
bert_train     2.6e-8; 2.7e-8                 1e-6       3e-4    1.9e-3
vit_train      2.8e-8; 2.7e-8                 1e-6       3e-4    8.7e-3
============== ============================== ========== ======= ==============================

float32: 1e-6 is ~30x the measured error, and still catches an update wrong by more than
0.05-0.5 % of its size (a doubled learning rate is caught 2000x over). The update alone (``p' - p``)
matches the reference to 3e-6..1.4e-5 relative in both frameworks, which is the parameters'
output rounding again. tf32 is not measured (no GPU here): TF32 rounds matmul operands to 2**-11
(4.9e-4), which a deep step's gradients might carry as a few 1e-3 relative error; scaled by the
update's 0.2-0.9 % share that is ~1e-5..1e-4, hence 3e-4 (a doubled learning rate still fails).
ResNet under TF+XLA does not compile while op determinism is on: TensorFlow's XLA bridge has no
deterministic MaxPoolGrad.

PyTorch (torch 2.13 CPU, eager, deterministic algorithms), norm-wise against the reference's norm,
seeds 3 and 1: against the reference 2.6e-8..3.7e-8 at tiny and cpu (the same as JAX's and TF's);
against JAX's step 2.1e-8..2.7e-8 (ResNet), 1.7e-9..4.8e-9 (BERT), 8.9e-9..1.3e-8 (ViT); against
TF's 1.3e-9..2.5e-8; the update alone 2.9e-6..1.5e-5 from the reference, as the others. In
float64 the PyTorch step is the reference to 1e-16 (the update to 1e-14): the architectures are
the same, and the float32 differences are rounding. ResNet at ``cpu`` with seed 3 is the
exception for all three frameworks: 3.1e-5 (JAX) and 3.3e-5 (TF, PyTorch) from the reference,
the update off by 1 %, PyTorch and TF within 2e-8 of each other but 1e-5 from JAX, while float64
PyTorch matches the reference to 6e-17: float32 rounding flips the sign of 2 of the 32,768
inputs (|x| ~ 3e-6) of the ReLU after ``stage4_block1/bn1``, and every parameter upstream of it
(its bias, stage 1-3, the stem) is updated 1-2 % off while those downstream are not: a step at a
ReLU's kink, not a framework's error, and past the 1e-6 tolerance in all three.
torch.compile (Inductor, fullgraph) gives the eager output to 1e-9..4e-8 norm-wise.
"""

from kernels.models import bert_train, resnet50_train, vit_train

MODEL_SPECS = {m.SPEC.name: m.SPEC for m in (resnet50_train, bert_train, vit_train)}
"""The three workloads by name, for the registry to take up."""
