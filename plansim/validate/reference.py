"""Single-process reference training of the same model, data and optimizer (torch).

The distributed run must reproduce these losses: same seed, same initialisation, same
synthetic batches, the same optimizer and hyper-parameters, the loss being the mean
cross-entropy over the whole global batch (one forward over all its sequences).
"""

from __future__ import annotations

from plansim.specs.model import ModelSpec
from plansim.validate.model import build_model, loss_fn, synthetic_batches
from plansim.validate.parallelize import optimizer_class


def reference_losses(
    model: ModelSpec, *, global_batch_size: int, num_steps: int, seed: int, optimizer: str = "adamw"
) -> list[float]:
    """Losses of ``num_steps`` full-batch steps in one process, fp32 on CPU; ``optimizer``
    is ``adamw`` or ``sgd`` with the runner's hyper-parameters."""
    net = build_model(model, seed=seed)
    cls, hyper = optimizer_class(optimizer)
    opt = cls(net.parameters(), **hyper)
    batches = synthetic_batches(model, global_batch_size=global_batch_size, seed=seed)
    losses = []
    for _ in range(num_steps):
        batch = next(batches)
        loss = loss_fn(net(batch.tokens), batch.targets)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses
